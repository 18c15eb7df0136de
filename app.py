"""omem workbench: the Streamlit entry. Pages live in workbench/app_pages/.

    streamlit run app.py        (or: python -m workbench app)
"""

import streamlit as st

import omem_core  # noqa: F401  (sets litellm's offline environment first)

# Only when Streamlit runs this script (as "__main__"): a process pool's fork server, started from
# the app, imports the running script as "__mp_main__", which ran the whole app there, headless.
if __name__ == "__main__":
    st.set_page_config(page_title="omem workbench", page_icon="🧠", layout="wide")
    # A narrow window (a laptop's 900 px with the sidebar open) left tables 440 px between two
    # 80 px margins; the margins shrink there. (A style only: no dataset or model text is HTML.)
    st.html("<style>@media (max-width: 1200px) { [data-testid='stMainBlockContainer'] "
            "{ padding-left: 1.5rem; padding-right: 1.5rem; } }</style>")

    pages = {
        "Experiments": [
            st.Page("workbench/app_pages/experiments.py", title="Experiments", icon=":material/science:"),
            st.Page("workbench/app_pages/tune.py", title="Tune", icon=":material/tune:"),
            st.Page("workbench/app_pages/compare.py", title="Compare", icon=":material/compare:"),
        ],
        "One run": [
            st.Page("workbench/app_pages/explorer.py", title="Replay explorer", icon=":material/search:", default=True),
            st.Page("workbench/app_pages/traces.py", title="Traces", icon=":material/receipt_long:"),
            st.Page("workbench/app_pages/present.py", title="Presentation", icon=":material/slideshow:"),
            st.Page("workbench/app_pages/runs.py", title="Runs", icon=":material/history:"),
            st.Page("workbench/app_pages/prompts.py", title="Prompts", icon=":material/edit_note:"),
        ],
    }
    from workbench import ui
    from workbench.runstore import RunStoreLocked

    try:
        st.navigation(pages).run()
    except RunStoreLocked as exc:  # another program opened the file since: a read-only snapshot from now
        ui.held_elsewhere(exc)
