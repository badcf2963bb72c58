"""The official `openai` Python SDK against /v1."""
import json

import openai
import pytest

from conftest import GERMANY, MODEL

QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_whole(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    assert r.choices[0].message.content == GERMANY
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model == MODEL


def test_chat_streamed_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GERMANY
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1


def test_chat_streamed_without_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stream=True, max_tokens=3))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, stop=["\n"])
    assert r.choices[0].text == " Paris."


def test_embeddings_base64_default(client):
    r = client.embeddings.create(model=MODEL, input=["Paris is in France.", "Berlin is in Germany."])
    assert [d.index for d in r.data] == [0, 1]
    assert len(r.data[0].embedding) == 576
    floats = client.embeddings.create(model=MODEL, input="Paris is in France.", encoding_format="float")
    assert all(abs(a - b) < 1e-6 for a, b in zip(floats.data[0].embedding, r.data[0].embedding))


def test_errors_raise_sdk_exceptions(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=QUESTION)
    assert "not found" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "is_capital"],
    "additionalProperties": False,
}


def test_response_format_json_schema_and_json_object(client):
    import json

    question = [{"role": "user", "content": "Give facts about Berlin as JSON."}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=question,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}},
    )
    city = json.loads(r.choices[0].message.content)
    assert sorted(city) == ["city", "is_capital", "population_millions"]
    assert city["city"] in ("Paris", "Berlin", "Rome")
    assert isinstance(city["population_millions"], int) and isinstance(city["is_capital"], bool)
    r = client.chat.completions.create(
        model=MODEL, messages=question, temperature=0, max_tokens=200, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_tools_on_a_template_without_tool_support_use_the_generic_format(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    # SmolLM2's template has no tools: a required call comes through the
    # generic format, its arguments shaped by the schema.
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=64, temperature=0
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments).get("city"), str)
    assert reply.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": []}}},
        )
    assert "enum must be a non-empty array" in e.value.message

    # Cut by the token limit inside the call: a tool call with the arguments
    # as far as they go and finish_reason "length", as OpenAI sends one,
    # whole and streamed; never the format's JSON as content.
    cut = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=19, temperature=0
    )
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.content is None
    (call,) = cut.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=19, temperature=0,
            stream=True,
        )
    )
    streamed = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments for c in chunks if c.choices[0].delta.tool_calls
    )
    assert streamed == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "length"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    # The SDK's stream helper refuses a cut reply, as it does OpenAI's.
    with pytest.raises(openai.LengthFinishReasonError):
        with client.chat.completions.stream(
            model=MODEL, messages=QUESTION, tools=tools, tool_choice="required", max_tokens=19, temperature=0
        ) as stream:
            stream.get_final_completion()
