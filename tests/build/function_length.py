#!/usr/bin/env python3
"""No function in the named source folders is longer than a limit (issue 30: the run reads top to bottom;
train/, bench/ and cli/ keep every function within ~100 lines).

  function_length.py LIMIT DIR [DIR ...]

A function is a definition that starts in column 0 (free functions, and members defined outside their
class: the house style, clang-formatted, does not indent namespace contents) and ends at the next line that
is a lone `}`; its length is the lines between them. Member functions written inside a class body (indented)
are measured the same way from their indented start to their indented closing brace. Exits 1 listing every
function over the limit.
"""
import pathlib
import re
import sys

START = re.compile(r"^(\s{0,2})(?!namespace\b|struct\b|class\b|enum\b|union\b|template\b|#|//|}|public:|private:"
                   r"|protected:|using\b|typedef\b|static_assert\b|extern\b|return\b)[A-Za-z_~].*[^;]$")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = START.match(lines[i])
        if not m or "(" not in lines[i]:
            i += 1
            continue
        indent = m.group(1)
        # The signature runs to the line that opens the body (or ends the declaration).
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";"):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";") or lines[j].rstrip().endswith("} {"):
            i = j + 1
            continue
        if lines[j].rstrip().endswith("= {") or re.search(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?"
                                                         r"(->\s*[\w:<>, ]+\s*)?\{$|^\s*:|\)\s*\{$|^\{$",
                                                         lines[j].strip()) is None:
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and lines[k].rstrip() != indent + "}":
            k += 1
        name = re.sub(r"\s*\(.*", "", lines[i].strip())
        yield name.split()[-1] if name.split() else name, i + 1, k - i - 1
        i = k + 1


def self_test(limit):
    """The check itself: a function of `limit` lines passes, one of limit + 1 (free or a member) does not."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        body = "\n".join(f"  x += {i};" for i in range(limit - 1))
        src = (f"int fits(int x) {{\n{body}\n  return x;\n}}\n\n"
               f"void Run::too_long(int x,\n                   int y) {{\n{body}\n  x += y;\n  x -= y;\n}}\n")
        (pathlib.Path(d) / "probe.cpp").write_text(src)
        found = {name: length for name, _, length in functions(pathlib.Path(d) / "probe.cpp")}
        over = [n for n, length in found.items() if length > limit]
        if over != ["Run::too_long"] or "fits" in over:
            sys.exit(f"function_length.py self-test: expected only Run::too_long over {limit}, found {found}")


def main():
    limit = int(sys.argv[1])
    self_test(limit)
    long = []
    for d in sys.argv[2:]:
        for path in sorted(pathlib.Path(d).rglob("*.cpp")):
            for name, line, length in functions(path):
                if length > limit:
                    long.append(f"{path}:{line}: {name} is {length} lines (limit {limit})")
    for entry in long:
        print(entry)
    sys.exit(1 if long else 0)


if __name__ == "__main__":
    main()
