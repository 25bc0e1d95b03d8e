"""One rule file per architecture: `<model_type>.py` defines `ARCH`, an `Architecture` (rules.py).

convert.py finds every module of this folder and registers its `ARCH` under its model_type (the
file's name): adding an architecture is adding its file (README: "Adding an architecture").
"""
