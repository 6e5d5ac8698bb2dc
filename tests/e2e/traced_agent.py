"""An agent on the OpenAI-compatible provider at TRACED_MODEL_URL, with one tool (trace tests)."""

from __future__ import annotations

import os

from pydantic import BaseModel

from runtime import Agent, tool
from runtime.providers.openai_compat import OpenAICompatModel


class LookupInput(BaseModel):
    city: str


@tool
async def lookup(args: LookupInput) -> dict[str, str]:
    """The weather of a city (fixed)."""
    return {"city": args.city, "weather": "sunny"}


def agent() -> Agent:
    model = OpenAICompatModel(
        "gpt-test", base_url=os.environ["TRACED_MODEL_URL"], api_key="sk-test", max_retries=0
    )
    return Agent(model=model, tools=[lookup], max_steps=3, name="traced")
