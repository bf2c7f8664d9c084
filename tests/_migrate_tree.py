"""What `migrate` reported over a tree, and the checks of a whole tree
(the repository-scale tests)."""

import re

from tf_lossscale.compat import migrate


def reported_lines(err):
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


def check_migrated_tree(tree, capsys, code, written, reported, again):
    """`migrate --write` over `tree` (the working directory) exits `code`,
    writes `written` files that compile and reports the `reported`
    `file:line`s; a second run changes nothing and reports `again` lines
    (lines of the written files now: the imports added moved them)."""
    assert migrate.run(["."], write=True) == code
    out, err = capsys.readouterr()
    wrote = sorted(line[len("wrote "):] for line in out.splitlines())
    assert len(wrote) == written, wrote
    for path in wrote:
        compile((tree / path).read_bytes(), path, "exec")
    assert reported_lines(err) == reported
    assert migrate.run(["."], write=False) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert len(reported_lines(err)) == again
