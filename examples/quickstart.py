"""Observational memory in a few lines, offline: no API key, no network.

    python examples/quickstart.py

The offline model `omem/extractive` keeps whole sentences, chosen by how specific their words
are (names, numbers, dates first): a baseline, not a language model. Pass any litellm model
string as observer and reflector (e.g. "gpt-4o-mini", with OPENAI_API_KEY set) for real notes.
"""

import asyncio
from datetime import datetime, timedelta, timezone

from omem_core import Memory, Message, create_observational_memory_store

TURNS = [
    ("user", "Hi! I'm Priya. I just moved to Lisbon from Toronto last month."),
    ("assistant", "Welcome to Lisbon, Priya! How are you settling in?"),
    ("user", "Good. I started a new job at Feedzai as a data engineer on 3 June."),
    ("assistant", "Congratulations on the new role!"),
    ("user", "Thanks. My sister Anika visits on 14 July, she is allergic to peanuts."),
    ("assistant", "Noted: plan peanut-free meals while Anika is in town."),
    ("user", "I'm also training for the Lisbon half marathon in October; my goal is 1:45."),
    ("assistant", "A 1:45 half needs about 4:59 per km. Want a plan?"),
    ("user", "Yes please, four runs a week. I prefer mornings before 7 am."),
    ("assistant", "Here is a four-day morning plan..."),
] * 3


async def main() -> None:
    store = create_observational_memory_store(
        observer="omem/extractive",   # the offline baseline; any litellm model string works
        reflector="omem/extractive",
        # Small, so this short chat shows both steps: a note per ~80 tokens of old messages,
        # and a reflection once the notes pass 160 tokens (the defaults are 1,000 and 2,000).
        thresholds={"observation": 80, "reflection": 160},
    )
    memory = Memory(store, last_messages=4)
    start = datetime(2024, 6, 20, 9, 0, tzinfo=timezone.utc)
    for i, (role, text) in enumerate(TURNS):
        await memory.save_messages(
            [Message(id=f"m{i}", thread_id="demo", role=role, content=text,
                     created_at=start + timedelta(hours=i))]
        )
        if role == "user":
            await memory.recall("demo")  # the read an agent makes before replying
    context = await memory.recall("demo")
    state = await store.inspect("demo", last=4)
    kinds = [record.kind for record in state.records]
    print(f"{len(TURNS)} messages; observed up to {state.cursor}; {kinds.count('observation')} observations, "
          f"{kinds.count('reflection')} reflection(s)\n")
    for message in context:
        print(f"[{message.role}]\n{message.content}\n")


if __name__ == "__main__":
    asyncio.run(main())
