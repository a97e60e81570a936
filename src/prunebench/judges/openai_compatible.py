"""Any server that speaks the chat-completions protocol (OpenAI, vLLM, SGLang, llama.cpp, a proxy),
through the `openai` client: its `base_url` reaches any of them, and its retries back off on 408,
409, 429 and 5xx (honouring the server's Retry-After), so none are hand-written here."""

from __future__ import annotations

import os

from prunebench.judges.base import Judge


class OpenAICompatibleJudge(Judge):
    """`url`: the server's base URL (null: api.openai.com); `api_key_env`: the environment variable
    holding the key (null for a server without keys). The key is read when the client is made and
    kept only inside it: never in the config, a log line or a repr."""

    def __init__(self, model: str, url: str | None = None, api_key_env: str | None = "OPENAI_API_KEY",
                 max_retries: int = 5, timeout_s: float = 120.0, name: str | None = None, repeats: int = 1,
                 max_failure_rate: float = 0.05):
        super().__init__(model, name, repeats, max_failure_rate)
        self.url, self.api_key_env, self.max_retries, self.timeout_s = url, api_key_env, max_retries, timeout_s
        self._client = None

    def __repr__(self) -> str:
        return f"OpenAICompatibleJudge(model={self.model!r}, url={self.url!r}, api_key_env={self.api_key_env!r})"

    def check(self) -> None:
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise ValueError(f"judge.api_key_env={self.api_key_env!r}: that environment variable is not set; "
                             f"export it, or set judge.api_key_env=null for a server that takes no key")

    def reach(self) -> None:
        """One GET <url>/models, without retries: a server that refuses connections, or a wrong host,
        fails validation naming the URL. Any HTTP answer means a server listens (one without that
        route answers 404, a key restricted to chat 403), except 401: the key itself is refused."""
        import openai

        where = self.url or "https://api.openai.com/v1"
        try:
            self.client().with_options(max_retries=0, timeout=min(self.timeout_s, 10.0)).models.list()
        except openai.AuthenticationError as err:
            sent = f"the key from ${self.api_key_env}" if self.api_key_env else "no key (judge.api_key_env=null)"
            raise ValueError(f"judge.url={where!r} refused {sent} (HTTP {err.status_code}); set the variable to a "
                             f"key that server accepts") from None
        except openai.APIConnectionError as err:  # a timeout is one too
            raise ValueError(f"judge.url={where!r}: no connection ({err.__cause__ or err}); start the judge server "
                             f"or set judge.url to the base URL it serves (http://HOST:PORT/v1)") from None
        except openai.APIStatusError:
            pass

    def client(self):
        if self._client is None:
            import openai

            key = os.environ[self.api_key_env] if self.api_key_env else "none"
            self._client = openai.OpenAI(base_url=self.url, api_key=key, max_retries=self.max_retries,
                                         timeout=self.timeout_s)
        return self._client

    def complete(self, messages: list[dict], temperature: float, max_tokens: int) -> str:
        response = self.client().chat.completions.create(model=self.model, messages=messages,
                                                         temperature=temperature, max_tokens=max_tokens)
        return response.choices[0].message.content or ""
