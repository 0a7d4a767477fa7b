"""``trajkit serve`` called by a page in headless Chromium: a listed origin gets a streamed answer,
any other origin is refused by the browser's CORS check (and no session runs)."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve_helpers import MODEL, ServeProcess, serve_policy, write_key
from tests.test_report import DevTools, chromium_missing, headless_chromium
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer

SERVER_KEY = "browser-server-key-1234567890"

PAGE = """<!doctype html><html><head><link rel="icon" href="data:,"></head><body><script>
(async () => {
  const out = {tools: 0};
  try {
    const response = await fetch(%(url)s, {
      method: 'POST',
      headers: {'Authorization': 'Bearer %(key)s', 'Content-Type': 'application/json'},
      body: JSON.stringify({model: %(model)s, stream: true, messages: [{role: 'user', content: %(prompt)s}]}),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = '', content = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      text += decoder.decode(value, {stream: true});
    }
    for (const block of text.split('\\n\\n')) {
      if (block.startsWith('event: trajkit.tool')) { out.tools += 1; continue; }
      if (!block.startsWith('data: {')) continue;
      const chunk = JSON.parse(block.slice(6));
      if (chunk.choices.length && chunk.choices[0].delta.content) content += chunk.choices[0].delta.content;
    }
    Object.assign(out, {status: response.status, content, done: text.endsWith('data: [DONE]\\n\\n')});
  } catch (error) {
    out.error = String(error);
  }
  document.body.dataset.result = JSON.stringify(out);
  document.body.dataset.ready = '1';
})();
</script></body></html>
"""


class Site:
    """A directory served over HTTP on its own port: an origin of its own."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    need_engine("chromium", chromium_missing())
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as tools:
        yield tools


def write_page(root: Path, base_url: str, prompt: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    values = {
        "url": json.dumps(f"{base_url}/chat/completions"),
        "key": SERVER_KEY,
        "model": json.dumps(MODEL),
        "prompt": json.dumps(prompt),
    }
    (root / "chat.html").write_text(PAGE % values)


def test_a_listed_origin_streams_and_another_is_refused(
    browser: DevTools, tmp_path: Path, sandbox_root: Path
) -> None:
    allowed, other = Site(tmp_path / "allowed"), Site(tmp_path / "other")
    key_file = write_key(tmp_path / "server.key", SERVER_KEY)
    with OpenAITestServer(serve_policy, models={MODEL}) as model_server:
        serving = ServeProcess(
            "--model", MODEL, "--base_url", model_server.base_url, "--server_key_file", str(key_file),
            "--cors_origin", allowed.origin, "--sandbox_option", f"local.root={sandbox_root}",
        )  # fmt: skip
        try:
            write_page(tmp_path / "allowed", serving.base_url, "Tidy the notes from a browser b1")
            write_page(tmp_path / "other", serving.base_url, "Tidy the notes from elsewhere b2")
            browser.open(f"{allowed.origin}/chat.html")
            result = json.loads(browser.js("document.body.dataset.result"))
            assert browser.problems() == []
            assert result["status"] == 200 and result["done"], result
            assert result["content"].startswith("I completed the task using 3 tool calls"), result
            assert result["tools"] == 6

            browser.open(f"{other.origin}/chat.html")
            refused = json.loads(browser.js("document.body.dataset.result"))
            assert "error" in refused and "content" not in refused, refused
            assert not [r for r in model_server.requests if "b2" in json.dumps(r.body["messages"])]
        finally:
            serving.stop()
            allowed.close()
            other.close()
