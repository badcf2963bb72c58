"""The official `openai` Python SDK's Responses API (`responses.create`,
`responses.stream`, `responses.parse`) against /v1/responses."""
import json

import openai
import pydantic
import pytest

from conftest import GERMANY, MODEL

QUESTION = "What is the capital of Germany?"


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def test_create_text(client):
    r = client.responses.create(model=MODEL, input=QUESTION, temperature=0)
    assert r.output_text == GERMANY
    assert r.status == "completed"
    assert r.id.startswith("resp_") and r.model == MODEL
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens > 5


def test_create_with_items_and_instructions(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    plain = client.responses.create(model=MODEL, input=items, temperature=0)
    assert plain.output_text == GERMANY
    instructed = client.responses.create(
        model=MODEL, input=items, instructions="You are a geography teacher.", temperature=0, max_output_tokens=30
    )
    assert instructed.instructions == "You are a geography teacher."
    # They replace the template's default system prompt.
    assert instructed.usage.input_tokens != plain.usage.input_tokens


def test_max_output_tokens_is_honoured(client):
    r = client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    assert GERMANY.startswith(r.output_text) and len(r.output_text) < len(GERMANY)


def test_stream_events_and_final_response(client):
    with client.responses.stream(model=MODEL, input=QUESTION, temperature=0) as stream:
        kinds = []
        text = ""
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert text == GERMANY
    assert final.output_text == GERMANY
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_create_stream_true(client):
    events = list(client.responses.create(model=MODEL, input=QUESTION, temperature=0, stream=True, max_output_tokens=4))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.usage.output_tokens == 4


class Capital(pydantic.BaseModel):
    city: str
    country_code: str


CAPITAL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "country_code": {"type": "string", "enum": ["FR", "DE", "IT"]},
    },
    "required": ["city", "country_code"],
    "additionalProperties": False,
}


def test_json_schema_text_format(client):
    r = client.responses.create(
        model=MODEL,
        input=QUESTION,
        temperature=0,
        max_output_tokens=100,
        text={"format": {"type": "json_schema", "name": "capital", "schema": CAPITAL_SCHEMA, "strict": True}},
    )
    capital = json.loads(r.output_text)
    assert sorted(capital) == ["city", "country_code"]
    assert capital["city"] in ("Paris", "Berlin", "Rome")
    assert r.text.format.type == "json_schema"


def test_parse_with_a_pydantic_model(client):
    r = client.responses.parse(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=100, text_format=Capital)
    assert isinstance(r.output_parsed, Capital)
    with client.responses.stream(
        model=MODEL, input=QUESTION, temperature=0, max_output_tokens=100, text_format=Capital
    ) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == r.output_parsed


def test_errors_raise_sdk_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input=QUESTION)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=QUESTION, previous_response_id="resp_1")
    assert "previous_response_id is not supported" in e.value.message
