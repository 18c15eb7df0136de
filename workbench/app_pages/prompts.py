"""Prompts: view, edit and save observer/reflector prompt versions."""

import streamlit as st

from omem_core import Prompt
from workbench import ui
from workbench.runstore import RunStoreError, version_problem

store = ui.get_store()
st.title("Prompts")
st.caption("Saved versions appear in the configuration forms of the explorer, Compare and Experiments. The "
           "built-in offline model reads only a prompt's layout, not its text: comparing prompt versions needs a "
           "real model.")

name = st.radio("Prompt", ["observer", "reflector"], horizontal=True, key="pr_name")
choices = ui.prompt_choices(store, name)
version = st.selectbox("Version", list(choices), key=f"pr_version_{name}")
prompt = choices[version]
header = st.empty()  # (filled once the text is read: it described the version, not the text edited)
text = st.text_area("Text (the system message of each compaction call)", prompt.text, height=360,
                    key=f"pr_text_{name}_{version}")
kept = [p for v, p in choices.items() if p.text == text and v != version]  # the edited text, saved as a version
if text == prompt.text:
    header.text(f"{prompt.label} · sha256 {prompt.sha256[:16]}… · {len(prompt.text)} characters")
elif kept:  # (it said "edited (not saved) … save it" of a text just saved, above "Saved …")
    header.text(f"{prompt.label}, edited · {len(text)} characters: the text of {kept[0].label}, saved")
else:
    header.text(f"{prompt.label}, edited (not saved) · {len(text)} characters (the version has "
                f"{len(prompt.text)}): save it as a new version to use it")
new_version = st.text_input("Save as version", value="", placeholder="e.g. v2-shorter", key=f"pr_new_{name}")
same = [v for v, p in choices.items() if p.text == text and v != new_version.strip()]
if new_version.strip() and same:  # (saved unchanged, a version compared equal to another under a new name)
    st.info(ui.plain(f"This text is the same as {name} {same[0]}'s: a version saved from it gives the same "
                     "notes as that one. Edit the text first to compare a new wording."))
named = new_version.strip()
if named and (problem := version_problem(named)):  # (said before the click, the button off)
    ui.error(f"**Version {ui.plain(repr(named))}:** ", problem)
if st.button("Save version", type="primary", key="pr_save",
             disabled=not named or store.read_only or version_problem(named) is not None):
    try:
        candidate = Prompt(name=name, version=new_version.strip(), text=text)
        if store.save_prompt(candidate):
            header.text(f"{prompt.label}, edited · {len(text)} characters: the text of {candidate.label}, saved")
            st.success(ui.plain(f"Saved {candidate.label} (sha256 {candidate.sha256[:16]}…).")
                       + " Pick it in the explorer, Compare or a new experiment.")
        else:  # (it said "Saved", and no version was added)
            st.info(ui.plain(f"{candidate.label} is already there with this text: nothing to save."))
    except (ValueError, RunStoreError) as exc:
        ui.error("", exc)

saved = store.prompts()
if not saved.empty:
    st.subheader("Saved versions")
    st.dataframe(saved[["name", "version", "sha256", "created_at"]], hide_index=True, key="pr_table")
