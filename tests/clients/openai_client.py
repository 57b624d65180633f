"""Drive kvsim's OpenAI API with the official `openai` package, unmodified.

Usage: python openai_client.py BASE_URL (e.g. http://127.0.0.1:PORT/v1). Prints one
JSON object per check on stdout; exits 1 on the first check that fails.
"""
import json
import sys

import openai


def main() -> int:
    base = sys.argv[1]
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=30)
    models = client.models.list()
    model = models.data[0].id
    print(json.dumps({"check": "models", "model": model}))

    c = client.completions.create(model=model, prompt="CANARY-oa-1 a b c d", max_tokens=3)
    print(json.dumps({"check": "completion", "text": c.choices[0].text,
                      "finish": c.choices[0].finish_reason,
                      "usage": c.usage.model_dump()}))

    chat = client.chat.completions.create(
        model=model, max_tokens=4,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "CANARY-oa-2 hello there"}])
    print(json.dumps({"check": "chat", "text": chat.choices[0].message.content,
                      "role": chat.choices[0].message.role,
                      "finish": chat.choices[0].finish_reason,
                      "usage": chat.usage.model_dump()}))

    deltas = []
    usage = None
    for chunk in client.completions.create(model=model, prompt="p q r s t", max_tokens=3,
                                           stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            deltas.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    print(json.dumps({"check": "completion-stream", "deltas": deltas, "usage": usage}))

    parts = []
    for chunk in client.chat.completions.create(
            model=model, max_tokens=2, stream=True,
            messages=[{"role": "user", "content": "u v w"}]):
        if chunk.choices and chunk.choices[0].delta.content is not None:
            parts.append(chunk.choices[0].delta.content)
    print(json.dumps({"check": "chat-stream", "parts": parts}))

    try:
        client.completions.create(model=model, prompt="a", max_tokens=-1)
        print(json.dumps({"check": "error", "raised": None}))
        return 1
    except openai.BadRequestError as e:
        print(json.dumps({"check": "error", "status": e.status_code, "message": e.message,
                          "param": (e.body or {}).get("param")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
