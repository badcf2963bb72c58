"""LangChain's Ollama and OpenAI chat models on a chat longer than the context.

The session's server serves a 1,024-token context: the history below is
about 3,000 tokens, so the server drops its oldest messages (keeping the
system message and the last question) and answers, as Ollama does, where a
400 would make LangChain raise.
"""
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI

from conftest import MODEL

FILLER = (
    "The river runs past the old mill and the stone bridge, where the farmers "
    "bring their grain every autumn before the first frost. "
)


def long_chat():
    messages = [SystemMessage("You are a helpful assistant.")]
    for i in range(10):
        messages.append(HumanMessage(f"Note {i}: " + FILLER * 4))
        messages.append(AIMessage(f"Noted {i}. " + FILLER))
    messages.append(HumanMessage("What is the capital of Germany?"))
    return messages


def test_chat_ollama_answers_a_chat_longer_than_the_context(server):
    llm = ChatOllama(model=MODEL, base_url=server.base, temperature=0, num_predict=8)
    reply = llm.invoke(long_chat())
    assert isinstance(reply, AIMessage)
    assert reply.content.strip()
    # The history was cut, not the reply: it fits the 1,024-token window.
    assert reply.usage_metadata["input_tokens"] <= 1024 - 8
    assert reply.usage_metadata["output_tokens"] <= 8


def test_chat_openai_answers_a_chat_longer_than_the_context(server):
    llm = ChatOpenAI(
        model=MODEL,
        base_url=f"{server.base}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=8,
        max_retries=0,
    )
    reply = llm.invoke(long_chat())
    assert reply.content.strip()
    assert reply.usage_metadata["input_tokens"] <= 1024 - 8
