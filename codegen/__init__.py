"""b12x code generator: specs -> jinja2 templates -> CuTe DSL modules -> ahead-of-time artifacts.

Pure Python; nothing here needs a GPU. The CuTe DSL compiler is imported only by the build
workers (codegen/build.py), jinja2 only by rendering (codegen/render.py).

Two layouts: a source checkout (templates/ and generated/ beside this package) and an installed
wheel, where the templates ship inside the package as codegen/templates and there is no
generated/. Either way codegen/source_index.json ships with the package (see codegen/identity.py)."""
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
# A checkout has pyproject.toml and templates/ at the top; site-packages has neither.
SOURCE_TREE = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "templates").is_dir()
TEMPLATES_DIR = REPO_ROOT / "templates" if SOURCE_TREE else PACKAGE_DIR / "templates"
GENERATED_DIR = REPO_ROOT / "generated"  # only meaningful when SOURCE_TREE
SOURCE_INDEX_PATH = PACKAGE_DIR / "source_index.json"
