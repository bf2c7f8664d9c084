"""What `migrate` reported over a tree (the repository-scale tests)."""

import re


def reported(err):
    """The `file:line`s reported, as lines of the file read (a report after
    `--write` names the written file's line and the one read)."""
    found = []
    for line in err.splitlines():
        if line.startswith("migrate: "):
            continue
        where = line.split(": ", 1)[0].removeprefix("./")
        before = re.search(r"\[line (\d+) before --write\]$", line)
        if before:
            where = f"{where.rsplit(':', 1)[0]}:{before.group(1)}"
        found.append(where)
    return found
