"""LangChain (`langchain-openai`, `langchain-ollama`) on the default model.

SmolLM2's chat template knows nothing of tools: hypura serves them in
llama.cpp's generic format (tools in the system prompt, the reply held to a
call or a response by a grammar). The 135M model is weak, so the assertions
are on shape: what the grammar guarantees and LangChain must parse.
"""
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from conftest import MODEL

QUESTION = "What is the weather in Paris? Use the get_weather tool."


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"Sunny in {city}, 18 degrees celsius."


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(description="The city's name")
    country: str = Field(description="The country the city is in")


def openai_chat(server):
    return ChatOpenAI(
        model=MODEL, base_url=f"{server.base}/v1", api_key="unused", temperature=0, max_tokens=120, max_retries=0
    )


def ollama_chat(server):
    return ChatOllama(model=MODEL, base_url=server.base, temperature=0, num_predict=120)


def assert_weather_calls(calls):
    assert calls, "no tool calls"
    for call in calls:
        assert call["name"] == "get_weather"
        assert set(call["args"]) == {"city"} and isinstance(call["args"]["city"], str)
        assert call["id"]


def test_openai_bind_tools_and_answer_the_result(server):
    reply = openai_chat(server).bind_tools([get_weather], tool_choice="required").invoke(QUESTION)
    assert_weather_calls(reply.tool_calls)
    assert reply.response_metadata["finish_reason"] == "tool_calls"

    results = [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in reply.tool_calls]
    answer = openai_chat(server).bind_tools([get_weather]).invoke([HumanMessage(QUESTION), reply, *results])
    if answer.tool_calls:
        assert_weather_calls(answer.tool_calls)
    else:
        assert isinstance(answer.content, str) and answer.content


def test_openai_bind_tools_streamed(server):
    chunks = list(openai_chat(server).bind_tools([get_weather], tool_choice="get_weather").stream(QUESTION))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert_weather_calls(whole.tool_calls)
    assert whole.content == ""


def test_ollama_bind_tools(server):
    reply = ollama_chat(server).bind_tools([get_weather]).invoke(QUESTION)
    assert_weather_calls(reply.tool_calls)
    assert reply.content == ""


def test_openai_structured_output(server):
    for method in ["json_schema", "function_calling"]:
        city = openai_chat(server).with_structured_output(City, method=method).invoke("Paris is the capital of France.")
        assert isinstance(city, City), method
        assert isinstance(city.name, str) and isinstance(city.country, str)


def test_ollama_structured_output(server):
    city = ollama_chat(server).with_structured_output(City).invoke("Paris is the capital of France.")
    assert isinstance(city, City)
    assert isinstance(city.name, str) and isinstance(city.country, str)
