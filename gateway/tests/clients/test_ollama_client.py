"""The official `ollama` Python client, and the calls Open WebUI and OpenClaw make."""
import httpx
import ollama
import pytest

from conftest import GERMANY, MODEL

GREEDY = {"temperature": 0}


@pytest.fixture
def client(server):
    return ollama.Client(host=server.base)


def test_list_and_show(client):
    models = client.list().models
    assert [m.model for m in models] == [MODEL]
    assert models[0].details.family == "llama"
    assert models[0].size == 98_362_432
    show = client.show(MODEL)
    assert show.modelinfo["llama.context_length"] == 8192
    assert "completion" in show.capabilities
    assert "<|im_start|>" in show.template


def test_generate_whole_and_streamed(client):
    r = client.generate(MODEL, "The capital of France is", raw=True, options={**GREEDY, "num_predict": 5})
    assert r.response == " Paris.\n\nThe"
    assert r.done and r.done_reason == "length"
    assert r.eval_count == 5 and r.prompt_eval_count == 5
    assert r.total_duration > 0 and r.eval_duration > 0
    parts = list(
        client.generate(MODEL, "The capital of France is", raw=True, stream=True, options={**GREEDY, "num_predict": 5})
    )
    assert "".join(p.response for p in parts) == " Paris.\n\nThe"
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_chat_whole_and_streamed(client):
    messages = [{"role": "user", "content": "What is the capital of Germany?"}]
    r = client.chat(MODEL, messages=messages, options=GREEDY)
    assert r.message.role == "assistant"
    assert r.message.content == GERMANY
    assert r.done_reason == "stop"
    parts = list(client.chat(MODEL, messages=messages, stream=True, options=GREEDY))
    assert "".join(p.message.content for p in parts) == GERMANY
    assert all(p.message.role == "assistant" for p in parts)
    assert parts[-1].eval_count > 0


def test_embeddings(client):
    r = client.embed(MODEL, input=["Paris is in France.", "Berlin is in Germany."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    assert abs(sum(x * x for x in r.embeddings[0]) - 1.0) < 1e-3
    legacy = client.embeddings(MODEL, prompt="Paris is in France.")
    assert len(legacy.embedding) == 576


def test_ps_after_use(client):
    client.generate(MODEL, "Hi", raw=True, options={**GREEDY, "num_predict": 1})
    ps = client.ps().models
    assert [m.model for m in ps] == [MODEL]
    assert ps[0].expires_at is not None


def test_errors_raise_response_error(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("nope:1b", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(MODEL, messages=[{"role": "user", "content": "x"}], think=True)
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        list(client.generate("nope", "x", stream=True))
    assert e.value.status_code == 404


def test_wrong_option_type_is_400(server):
    r = httpx.post(
        f"{server.base}/api/chat",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "options": {"top_k": "many"}},
    )
    assert r.status_code == 400
    assert "options.top_k" in r.json()["error"]


def test_open_webui_startup_and_unload(server):
    with httpx.Client(base_url=server.base, timeout=30) as http:
        version = http.get("/api/version").json()["version"]
        assert all(part.isdigit() for part in version.split("."))
        assert http.get("/api/tags").json()["models"][0]["name"] == MODEL
        assert "models" in http.get("/api/ps").json()
        r = http.post("/api/generate", json={"model": MODEL, "keep_alive": 0, "prompt": ""})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload"
        assert http.get("/api/ps").json()["models"] == []


def test_openclaw_discovery_and_streamed_chat(server):
    with httpx.Client(base_url=server.base) as http:
        tags = http.get("/api/tags", timeout=5).json()["models"]
        show = http.post("/api/show", json={"name": tags[0]["name"]}, timeout=3).json()
        context = next(v for k, v in show["model_info"].items() if k.endswith(".context_length"))
        assert context == 8192 and "completion" in show["capabilities"]
        body = {
            "model": tags[0]["name"],
            "stream": True,
            "messages": [{"role": "user", "content": "What is the capital of Germany?"}],
            "options": {"num_ctx": context, "temperature": 0},
        }
        import json

        with http.stream("POST", "/api/chat", json=body, timeout=120) as r:
            chunks = [json.loads(line) for line in r.iter_lines() if line]
        assert "".join(c["message"]["content"] for c in chunks) == GERMANY
        assert chunks[-1]["done"] and chunks[-1]["prompt_eval_count"] > 0 and chunks[-1]["eval_count"] > 0


CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "is_capital"],
}


def test_format_json_and_schema(client):
    import json

    question = 'What is the capital of France? Reply in JSON with the key "capital".'
    r = client.generate(MODEL, question, format="json", options={**GREEDY, "num_predict": 200})
    assert r.done_reason == "stop"
    assert json.loads(r.response)["data"]["title"] == "Paris"
    r = client.chat(
        MODEL,
        messages=[{"role": "user", "content": "Give facts about Berlin as JSON."}],
        format=CITY_SCHEMA,
        options=GREEDY,
    )
    city = json.loads(r.message.content)
    assert sorted(city) == ["city", "is_capital", "population_millions"]
    assert city["city"] in ("Paris", "Berlin", "Rome")
    assert isinstance(city["population_millions"], int) and isinstance(city["is_capital"], bool)


def test_tools_on_a_template_without_tool_support_use_the_generic_format(client):
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
          city: the city's name
        """
        return "sunny"

    # SmolLM2's template has no tools: the generic format (a grammar) answers
    # with either a well-formed call or text.
    reply = client.chat(
        MODEL,
        messages=[{"role": "user", "content": "Weather in Paris? Use get_weather."}],
        tools=[get_weather],
        options={"temperature": 0, "num_predict": 64},
    )
    calls = reply.message.tool_calls or []
    assert calls or reply.message.content
    for call in calls:
        assert call.function.name == "get_weather"
        assert isinstance(call.function.arguments.get("city"), str)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(MODEL, messages=[{"role": "user", "content": "x"}], format={"type": "banana"})
    assert e.value.status_code == 400
    assert "unrecognized type" in e.value.error
