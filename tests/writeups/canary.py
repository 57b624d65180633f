# A canary-marker test: does a reply ever carry bytes from
# another request? Cheap to run, and it fails loudly.
import uuid, requests

MARKERS = {}

def ask(prompt_tokens: int, session: str) -> str:
    marker = f"CANARY-{session}-{uuid.uuid4().hex[:8]}"
    MARKERS[marker] = session
    body = {"model": "glm-5.3", "max_tokens": 16,
            "prompt": marker + " x" * prompt_tokens}
    return requests.post("http://prefill:30000/generate", json=body, timeout=600).text

# Long request that the pool cannot hold, then a short one right behind it.
ask(700_000, "big")
out = ask(64, "small")

for marker, owner in MARKERS.items():
    if marker in out and owner != "small":
        raise SystemExit(f"LEAK: response for 'small' carried {owner}'s marker")
