#!/usr/bin/env python3
"""A scripted model server on 127.0.0.1 for scripts/test-clients.sh: it speaks the Anthropic
Messages API (POST /v1/messages, streamed) to Claude Code and the OpenAI Responses API
(POST /v1/responses, streamed) to Codex, and answers with a fixed sequence of tool calls
per scenario, so the real clients run their real tools and hooks without a model or a key.

The scenario is named in the prompt (`SCENARIO:NAME`). The step is the number of tool
results already in the conversation, so the server keeps no state between requests. Every
request is logged as one JSON line (scenario, step, the text of the tool results and of
the context the client added since the last step), which the test reads back.

Usage: clients-model.py PORTFILE LOGFILE  (binds 127.0.0.1:0, writes the port to PORTFILE)
"""

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_LOCK = threading.Lock()

# Each scenario: a list of steps; a step is (tool kind, input) or ("end", text). Tool kinds
# are mapped to each client's own tool names below.
SCENARIOS = {
    # the giver, fenced on plan.md: each write refused, one the hook cannot see
    "giver": [
        ("write", {"path": "plan.md", "content": "giver was here\n"}),
        ("shell", {"command": "echo more >> plan.md"}),
        ("shell", {"command": 'F=plan.md; echo x >> "$F"'}),
        ("end", "giver done"),
    ],
    # Codex's giver: apply_patch, then the shell
    "giver-codex": [
        ("patch", {"path": "plan.md", "old": "plan v2", "new": "patched"}),
        ("shell", {"command": "echo more >> plan.md"}),
        ("end", "giver done"),
    ],
    # bob: the MCP tools, found through the tool search when deferred
    "mcp": [
        ("search", {"query": "select:mcp__coherent__inbox,mcp__coherent__whoami"}),
        ("mcp", {"tool": "whoami"}),
        ("mcp", {"tool": "inbox"}),
        ("end", "mcp done"),
    ],
    "mcp-codex": [
        ("mcp", {"tool": "whoami"}),
        ("mcp", {"tool": "inbox"}),
        ("end", "mcp done"),
    ],
    # a plain run that writes a file of its own (for the relay at compaction)
    "worker": [
        ("shell", {"command": "echo work >> work.md"}),
        ("end", "worker done"),
    ],
    "worker-codex": [
        ("shell", {"command": "echo work >> codex.md"}),
        ("end", "worker done"),
    ],
    "hello": [("end", "hello")],
}


def scenario_of(text):
    m = re.search(r"SCENARIO:([a-z-]+)", text)
    return m.group(1) if m else None


def log(path, entry):
    with LOG_LOCK, open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def text_of(content):
    """All text in an Anthropic content value (string or blocks, tool results included)."""
    if isinstance(content, str):
        return content
    out = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text":
            out.append(b.get("text", ""))
        elif b.get("type") == "tool_result":
            out.append(text_of(b.get("content")))
    return "\n".join(out)


def sse(handler, events):
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    # the stream ends with the connection: no length is known ahead
    handler.send_header("Connection", "close")
    handler.close_connection = True
    handler.end_headers()
    for name, data in events:
        chunk = ""
        if name:
            chunk += f"event: {name}\n"
        chunk += f"data: {json.dumps(data)}\n\n"
        handler.wfile.write(chunk.encode())
        handler.wfile.flush()


def json_reply(handler, obj, code=200):
    body = json.dumps(obj).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


# ---- Anthropic Messages -------------------------------------------------------------------


def claude_tool(kind, inp, tools):
    names = [t.get("name") for t in tools]
    if kind == "write":
        return "Write", {"file_path": inp["path"], "content": inp["content"]}
    if kind == "shell":
        return "Bash", {"command": inp["command"], "description": "scripted"}
    if kind == "search":
        name = next((n for n in names if n and "ToolSearch" in n), None)
        if name is None:
            return None
        return name, {"query": inp["query"], "max_results": 5}
    if kind == "mcp":
        return f"mcp__coherent__{inp['tool']}", {}
    return None


def anthropic(handler, req, logpath):
    msgs = req.get("messages", [])
    first = text_of(msgs[0]["content"]) if msgs else ""
    system = req.get("system")
    sys_text = system if isinstance(system, str) else text_of(system)
    name = scenario_of(first)
    steps = SCENARIOS.get(name) if name else None
    tools = req.get("tools") or []
    # the step: tool results so far
    done = sum(
        1
        for m in msgs
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    )
    last = msgs[-1] if msgs else {}
    # what the client added since the model's last turn: the tool results and any
    # context (hooks' additionalContext arrives as text blocks or messages of its own)
    since = []
    for m in reversed(msgs):
        if m.get("role") == "assistant":
            break
        since.insert(0, text_of(m.get("content")))
    entry = {
        "api": "anthropic",
        "scenario": name,
        "step": done,
        "tools": [t.get("name") for t in tools],
        "last": "\n".join(since),
        "raw": json.dumps(msgs[-3:])[-3000:],
        "first": first,
        "system": sys_text[-4000:] if sys_text else "",
    }
    if steps is None:
        # a client's side request (a title, a check): a short text
        step = ("end", "ok")
    else:
        # a deferred tool the search has not loaded is skipped to the next step
        step = steps[min(done, len(steps) - 1)]
    call = None
    if step[0] != "end":
        call = claude_tool(step[0], step[1], tools)
        if call is None:
            step = ("end", f"no tool for {step[0]}")
    entry["answer"] = call[0] if call else step[1]
    log(logpath, entry)
    mid = f"msg_{done}_{abs(hash(first)) % 100000}"
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": req.get("model", "m"),
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    ]
    if call:
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0,
             "content_block": {"type": "tool_use", "id": f"toolu_{done:02d}x{mid[-5:]}",
                               "name": call[0], "input": {}}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": json.dumps(call[1])}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
             "delta": {"stop_reason": "tool_use", "stop_sequence": None},
             "usage": {"output_tokens": 10}}),
        ]
    else:
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": step[1]}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
             "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": 5}}),
        ]
    events.append(("message_stop", {"type": "message_stop"}))
    if req.get("stream"):
        sse(handler, events)
    else:
        content = []
        if call:
            content.append({"type": "tool_use", "id": f"toolu_{done:02d}", "name": call[0],
                            "input": call[1]})
        else:
            content.append({"type": "text", "text": step[1]})
        json_reply(handler, {"id": mid, "type": "message", "role": "assistant",
                             "model": req.get("model", "m"), "content": content,
                             "stop_reason": "tool_use" if call else "end_turn",
                             "usage": {"input_tokens": 10, "output_tokens": 5}})


# ---- OpenAI Responses ---------------------------------------------------------------------


def responses_text(item):
    c = item.get("content")
    if isinstance(c, str):
        return c
    out = []
    for p in c or []:
        if isinstance(p, dict) and isinstance(p.get("text"), str):
            out.append(p["text"])
    return "\n".join(out)


def codex_tool(kind, inp, tools):
    by = {}
    for t in tools:
        n = t.get("name") or (t.get("function") or {}).get("name")
        if n:
            by[n] = t
    if kind == "shell":
        for n in ("exec_command", "shell_command", "shell"):
            if n in by:
                if n == "exec_command":
                    return "function_call", n, {"cmd": inp["command"]}
                if n == "shell_command":
                    return "function_call", n, {"command": inp["command"]}
                return "function_call", n, {"command": ["bash", "-lc", inp["command"]]}
        return None
    if kind == "patch":
        patch = (f"*** Begin Patch\n*** Update File: {inp['path']}\n@@\n-{inp['old']}\n"
                 f"+{inp['new']}\n*** End Patch\n")
        t = by.get("apply_patch")
        if t is None:
            # without the tool (a model Codex has no metadata for), Codex still takes a
            # patch given to its shell as `apply_patch` and applies it as that tool
            if "exec_command" in by:
                return "function_call", "exec_command", {
                    "cmd": f"apply_patch <<'EOF'\n{patch}EOF\n"}
            return None
        if t.get("type") == "custom":
            return "custom_tool_call", "apply_patch", patch
        return "function_call", "apply_patch", {"input": patch}
    if kind == "mcp":
        # MCP tools come in a namespace (`mcp__coherent`), called by name and namespace
        for t in tools:
            if t.get("type") == "namespace" and t.get("name") == "mcp__coherent":
                for f in t.get("tools") or []:
                    if f.get("name") == inp["tool"]:
                        return "function_call", f["name"], {}, "mcp__coherent"
        for n in by:
            if n.endswith(inp["tool"]) and "coherent" in n:
                return "function_call", n, {}
        return None
    if kind == "search":
        return None
    return None


def openai(handler, req, logpath):
    items = req.get("input") or []
    texts = [responses_text(i) for i in items if i.get("type") == "message"
             and i.get("role") == "user"]
    first = next((t for t in texts if "SCENARIO:" in t), texts[0] if texts else "")
    name = scenario_of(first)
    steps = SCENARIOS.get(name) if name else None
    tools = req.get("tools") or []
    outputs = [i for i in items if i.get("type") in
               ("function_call_output", "custom_tool_call_output")]
    done = len(outputs)
    tail = []
    # what came after the last call: its output, and any context the client added
    last_call = max((k for k, i in enumerate(items) if i.get("type") in
                     ("function_call", "custom_tool_call")), default=-1)
    for i in items[last_call + 1:] if last_call >= 0 else items[-1:]:
        if i.get("type") in ("function_call_output", "custom_tool_call_output"):
            o = i.get("output")
            tail.append(o if isinstance(o, str) else json.dumps(o))
        elif i.get("type") == "message":
            tail.append(responses_text(i))
    entry = {
        "api": "openai", "scenario": name, "step": done,
        "tools": [t.get("name") or (t.get("function") or {}).get("name") for t in tools],
        "last": "\n".join(tail), "first": first,
        "all": "\n".join(responses_text(i) for i in items if i.get("type") == "message")[-6000:],
        "instructions": (req.get("instructions") or "")[-2000:],
        "tool_types": [t.get("type") for t in tools],
        "namespaces": [t for t in tools if t.get("type") == "namespace"][:2],
    }
    step = ("end", "ok") if steps is None else steps[min(done, len(steps) - 1)]
    call = codex_tool(step[0], step[1], tools) if step[0] != "end" else None
    if step[0] != "end" and call is None:
        step = ("end", f"no tool for {step[0]}")
    entry["answer"] = call[1] if call else step[1]
    log(logpath, entry)
    rid = f"resp_{done}"
    if call:
        kind, n, args = call[:3]
        cid = f"call_{done}"
        if kind == "custom_tool_call":
            item = {"type": "custom_tool_call", "id": f"ctc_{done}", "status": "completed",
                    "call_id": cid, "name": n, "input": args}
        else:
            item = {"type": "function_call", "id": f"fc_{done}", "status": "completed",
                    "call_id": cid, "name": n, "arguments": json.dumps(args)}
            if len(call) > 3:
                item["namespace"] = call[3]
    else:
        item = {"type": "message", "id": f"m_{done}", "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step[1], "annotations": []}]}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 15}
    resp = {"id": rid, "object": "response", "status": "in_progress", "model":
            req.get("model", "m"), "output": []}
    done_resp = dict(resp, status="completed", output=[item], usage=usage)
    events = [
        ("response.created", {"type": "response.created", "response": resp}),
        ("response.output_item.added", {"type": "response.output_item.added",
                                        "output_index": 0, "item": item}),
        ("response.output_item.done", {"type": "response.output_item.done",
                                       "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": done_resp}),
    ]
    sse(handler, events)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        # model lists and the like: an empty, well-formed answer
        json_reply(self, {"data": [], "object": "list", "models": []})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            req = {}
        path = self.path.split("?")[0]
        if path.endswith("/messages/count_tokens"):
            return json_reply(self, {"input_tokens": 10})
        if path.endswith("/messages"):
            return anthropic(self, req, LOGFILE)
        if path.endswith("/responses"):
            return openai(self, req, LOGFILE)
        log(LOGFILE, {"api": "other", "path": path})
        json_reply(self, {"error": {"message": f"no {path} here"}}, 404)


if __name__ == "__main__":
    portfile, LOGFILE = sys.argv[1], sys.argv[2]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(portfile + ".tmp", portfile)
    srv.serve_forever()
