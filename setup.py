"""The one thing pyproject.toml cannot say: the top-level migrations/ folder ships inside the wheel as
peloton/migrations, so that an installed daemon can upgrade its store (`peloton db upgrade`, and every start)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["peloton*"]), "peloton.migrations", "peloton.migrations.versions",
              "peloton.console.assets"],  # the web console's pages: data, no Python (docs/ui.md)
    package_dir={"peloton.migrations": "migrations", "peloton.migrations.versions": "migrations/versions"},
    package_data={"peloton": ["py.typed"], "peloton.migrations": ["script.py.mako"],
                  "peloton.console.assets": ["*.html", "*.js", "*.css", "*.svg"]},
)
