"""Optional narration: findings turned into prose by an OpenAI-compatible chat endpoint the
operator configures. Off by default; nothing in Persys downloads or runs a model.

Findings never depend on it: the rules have run and ranked before anything is sent, and a
narration that fails is reported beside the findings, never instead of them. What is sent is
returned with the answer (`narration.sent`), and with anonymisation (on by default) the names
of workloads, nodes, images and addresses are replaced by placeholders before sending and put
back in the text received. Only the findings' cause, summary, remedy and evidence ids are sent,
never the evidence bodies (documents, log lines).

Configuration (the gateway's environment): PERSYS_NARRATION_URL (the API base, e.g.
http://127.0.0.1:8000/v1), PERSYS_NARRATION_MODEL, PERSYS_NARRATION_API_KEY (optional, sent as a
bearer token), PERSYS_NARRATION_ANONYMIZE (1 by default; 0 sends names as they are).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

TIMEOUT = 30.0
MAX_ANSWER = 8000
SYSTEM = ("You explain a compute cluster's diagnosis to its operator in a few sentences. Use only the findings "
          "given; do not invent causes; name the first finding as the likeliest cause and say what to do.")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_IMAGE = re.compile(r"\b[\w.-]+(?::\d+)?/[\w./-]+:[\w.-]+\b")


@dataclass(frozen=True)
class NarrationConfig:
    url: str
    model: str
    api_key: str = ""
    anonymize: bool = True


def config_from(env: Mapping[str, str]) -> NarrationConfig | None:
    url = env.get("PERSYS_NARRATION_URL", "").strip()
    if not url:
        return None
    return NarrationConfig(url.rstrip("/"), env.get("PERSYS_NARRATION_MODEL", "").strip() or "default",
                           env.get("PERSYS_NARRATION_API_KEY", ""), env.get("PERSYS_NARRATION_ANONYMIZE", "1") != "0")


def _names(investigation: Mapping[str, Any]) -> list[str]:
    names = {str(investigation["subject"]).split("/", 1)[-1]}
    for f in investigation.get("findings") or ():
        for i in f.get("evidence") or ():
            kind, _, rest = str(i).partition("/")
            if kind in ("workload", "node", "explain"):
                names.add(rest.split("@", 1)[0])
                if kind == "explain":
                    names.add(rest.split("@", 1)[-1])
    return sorted((n for n in names if len(n) > 1), key=lambda n: (-len(n), n))


def anonymise(text: str, mapping: dict[str, str]) -> str:
    for pattern, prefix in ((_IMAGE, "image"), (_IP, "address")):
        for m in sorted(set(pattern.findall(text)), key=lambda s: (-len(s), s)):
            mapping.setdefault(m, f"{prefix}-{sum(1 for v in mapping.values() if v.startswith(prefix)) + 1}")
    for real, alias in sorted(mapping.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        text = text.replace(real, alias)
    return text


def payload(investigation: Mapping[str, Any], config: NarrationConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The request body sent, and the placeholder -> real name map (empty without anonymisation)."""
    mapping: dict[str, str] = {}
    if config.anonymize:
        for k, n in enumerate(_names(investigation), 1):
            mapping[n] = f"name-{k}"
    items = [{"cause": f["cause"], "summary": f["summary"], "remedy": f.get("remedy", ""),
              "evidence": f.get("evidence", [])} for f in investigation.get("findings") or ()]
    text = json.dumps({"subject": investigation["subject"], "inconclusive": investigation.get("inconclusive", False),
                       "findings": items}, indent=1)
    if config.anonymize:
        text = anonymise(text, mapping)
    body = {"model": config.model, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}
    return body, {v: k for k, v in mapping.items()}


async def narrate(investigation: Mapping[str, Any], config: NarrationConfig | None,
                  client: httpx.AsyncClient | None = None) -> dict[str, Any]:
    if config is None:
        return {"enabled": False}
    body, back = payload(investigation, config)
    headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    out: dict[str, Any] = {"enabled": True, "endpoint": config.url, "anonymized": config.anonymize, "sent": body}
    own = client is None
    http = client or httpx.AsyncClient(timeout=TIMEOUT)
    try:
        r = await http.post(f"{config.url}/chat/completions", json=body, headers=headers)
        r.raise_for_status()
        text = str(r.json()["choices"][0]["message"]["content"])[:MAX_ANSWER]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as err:
        return {**out, "error": f"narration failed ({type(err).__name__}): the findings stand without it"}
    finally:
        if own:
            await http.aclose()
    for alias, real in sorted(back.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        text = text.replace(alias, real)
    return {**out, "text": text}
