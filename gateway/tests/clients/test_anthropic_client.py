"""The official `anthropic` Python SDK (`messages.create`, `messages.stream`)
against /v1/messages."""
import anthropic
import pytest

from conftest import GERMANY, MODEL

QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]
# This SDK no longer takes temperature (Anthropic's newer models fix it); the server still does.
GREEDY = {"temperature": 0}


def prompt_tokens(usage):
    """The whole prompt: Anthropic counts what the prompt cache held apart."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)


def test_create(client):
    m = client.messages.create(model=MODEL, max_tokens=64, messages=QUESTION, extra_body=GREEDY)
    assert m.content[0].type == "text" and m.content[0].text == GERMANY
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.role == "assistant" and m.model == MODEL and m.id.startswith("msg_")
    assert prompt_tokens(m.usage) > 10 and m.usage.output_tokens > 5


def test_system_max_tokens_and_stop_sequences(client):
    plain = client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION, extra_body=GREEDY)
    taught = client.messages.create(
        model=MODEL, max_tokens=8, messages=QUESTION, extra_body=GREEDY, system="You are a geography teacher."
    )
    # It replaces the template's default system prompt.
    assert prompt_tokens(taught.usage) != prompt_tokens(plain.usage)
    cut = client.messages.create(model=MODEL, max_tokens=3, messages=QUESTION, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    stopped = client.messages.create(
        model=MODEL, max_tokens=64, messages=QUESTION, extra_body=GREEDY, stop_sequences=["Berlin"]
    )
    assert stopped.content[0].text == "The capital of Germany is "
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Berlin"


def test_stream(client):
    with client.messages.stream(model=MODEL, max_tokens=64, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == GERMANY
    assert final.content[0].text == GERMANY
    assert final.stop_reason == "end_turn"
    assert prompt_tokens(final.usage) > 10 and final.usage.output_tokens > 5


def test_create_stream_true_events(client):
    events = list(client.messages.create(model=MODEL, max_tokens=64, messages=QUESTION, extra_body=GREEDY, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2].delta.stop_reason == "end_turn"


def test_errors_raise_sdk_exceptions(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=5, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=5, messages=[])
    assert e.value.body["error"]["message"] == "messages must not be empty"
