"""A small MCP server on the standard library alone (JSON-RPC 2.0, one message a line on standard
input and output), for per-session tests in sandboxes whose image has Python but not the ``mcp``
package, nor even ``json`` (Debian's python3-minimal, as in the Docker test image): the tests pass
this file's text as ``python3 -c``. Its tools work on the files of its
working directory (the sandbox's), so a test can see which sandbox a server runs in."""

import os
import re
import sys

try:
    from json import dumps, loads
except ImportError:  # python3-minimal: JSON read as Python literals, written by hand
    import ast

    TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\btrue\b|\bfalse\b|\bnull\b')
    LITERALS = {"true": "True", "false": "False", "null": "None"}

    def loads(text):
        return ast.literal_eval(TOKEN.sub(lambda m: LITERALS.get(m.group(0), m.group(0)), text))

    def dumps(value):
        if isinstance(value, dict):
            return "{" + ", ".join(f"{dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(dumps(v) for v in value) + "]"
        if isinstance(value, str):
            escaped = "".join(
                c if 32 <= ord(c) < 127 and c not in '"\\' else f"\\u{ord(c):04x}" for c in value
            )
            return f'"{escaped}"'
        if value is None or isinstance(value, bool):
            return {None: "null", True: "true", False: "false"}[value]
        return str(value)


TOOLS = [
    {
        "name": "write_note",
        "description": "Write a note to a file of the working directory.",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
            "required": ["name", "text"],
        },
    },
    {
        "name": "environment",
        "description": "The value of one of the server's environment variables.",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
    {
        "name": "flood",
        "description": "Answer with this many megabytes of text.",
        "inputSchema": {"type": "object", "properties": {"megabytes": {"type": "integer"}}},
    },
    {
        "name": "list_files",
        "description": "The names of the files in the working directory.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def call(name, arguments):
    if name == "write_note":
        with open(os.path.basename(arguments["name"]), "w") as handle:
            handle.write(arguments["text"])
        return {"content": [{"type": "text", "text": "written"}]}
    if name == "environment":
        return {"content": [{"type": "text", "text": str(os.environ.get(arguments["name"]))}]}
    if name == "flood":
        return {"content": [{"type": "text", "text": "x" * (arguments["megabytes"] << 20)}]}
    if name == "list_files":
        names = sorted(n for n in os.listdir(".") if not n.startswith("."))
        return {
            "content": [{"type": "text", "text": dumps(names)}],
            "structuredContent": {"files": names},
        }
    return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stdlib-notes", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        return call(params["name"], params.get("arguments") or {})
    if method == "ping":
        return {}
    return None


for line in sys.stdin:
    request = loads(line)
    if "id" not in request:
        continue  # a notification
    result = answer(request)
    if result is None:
        reply = {
            "jsonrpc": "2.0",
            "id": request["id"],
            "error": {"code": -32601, "message": "no such method"},
        }
    else:
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
    sys.stdout.write(dumps(reply) + "\n")
    sys.stdout.flush()
