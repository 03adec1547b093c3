"""Shared by the binary tests (test_binaries.py, test_packaging.py): the flags a binary's
--helpxml says this repository defines, and the flag blocks of its --help."""

import re
import xml.etree.ElementTree as ElementTree

from model_fixtures import REPO_ROOT

PACKAGES = ("tf_transformer", "export", "data")  # where binaries live


def project_flags(helpxml: str) -> dict[str, str]:
    """name -> help text of the flags defined by this repository's modules."""
    flags = {}
    for flag in ElementTree.fromstring(helpxml).iter("flag"):
        where = flag.findtext("file")
        if where.startswith(REPO_ROOT) or where.split(".")[0] in PACKAGES:
            flags[flag.findtext("name")] = flag.findtext("meaning")
    return flags


def help_blocks(help_text: str) -> dict[str, str]:
    """--help's flags: "  --name: help" or "  --[no]name: help", then indented lines."""
    return dict(re.findall(r"^  --(?:\[no\])?(\w+): (.*(?:\n    .*)*)", help_text, re.M))
