"""b12x code generator: specs -> jinja2 templates -> CuTe DSL modules -> ahead-of-time artifacts.

Pure Python; nothing here needs a GPU. The CuTe DSL compiler is imported only by the build
workers (codegen/build.py)."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
GENERATED_DIR = REPO_ROOT / "generated"
