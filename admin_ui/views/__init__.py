"""The console's pages: thin Streamlit code over the logic modules in `admin_ui/`. Each exposes `render()`."""
