"""omem workbench: the Streamlit entry. Pages live in workbench/app_pages/.

    streamlit run app.py        (or: python -m workbench app)
"""

import streamlit as st

import omem_core  # noqa: F401  (sets litellm's offline environment first)

st.set_page_config(page_title="omem workbench", page_icon="🧠", layout="wide")

pages = [
    st.Page("workbench/app_pages/explorer.py", title="Replay explorer", icon="🔎", default=True),
    st.Page("workbench/app_pages/compare.py", title="Compare", icon="⚖️"),
    st.Page("workbench/app_pages/tune.py", title="Tune", icon="🎛️"),
    st.Page("workbench/app_pages/prompts.py", title="Prompts", icon="📝"),
    st.Page("workbench/app_pages/runs.py", title="Runs", icon="🗂️"),
    st.Page("workbench/app_pages/present.py", title="Presentation", icon="🎬"),
]
st.navigation(pages).run()
