"""Translation units for the header self-containment check (tests/CMakeLists.txt, ctest
build.headers_are_self_contained), fewer than one per header and each header still checked as if alone.

  header_chains.py INCLUDE_DIR OUT_DIR

A header B compiles in a unit after headers A1..Ak exactly as it compiles alone when every Ai is one B
includes itself, directly or through other gclab headers: whatever the Ai bring in, B brings in too (its
includes come first in its text, as the style notes ask). So the headers are split into chains — each header
includes all the ones before it in its chain — and each chain is one unit, including them in that order.
The fewest chains are a minimum chain cover of the "is included by" order (Dilworth / Fulkerson: the
headers less a maximum matching of comparable pairs).

Headers whose includes reach LibTorch (torch/, ATen/, c10/) are chained apart from the others: their units
compile with a precompiled header of the narrow LibTorch headers they include, the others without one (so
a missing standard include is not hidden by LibTorch's). Writes OUT_DIR/<first header's id>.cpp per chain
and prints two lines, `torch,<unit>,...` then `plain,<unit>,...`.
"""
import os
import re
import sys


def read_headers(root):
    headers = {}
    for d, _, files in os.walk(os.path.join(root, "gclab")):
        for f in files:
            if f.endswith(".h"):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    headers[os.path.relpath(path, root).replace(os.sep, "/")] = fh.read()
    return headers


def main():
    root, out = sys.argv[1], sys.argv[2]
    text = read_headers(root)
    includes = {h: set(re.findall(r'^#include\s+"(gclab/[^"]+)"', t, re.M)) & text.keys() for h, t in text.items()}
    closure = {}

    def close(h):
        if h not in closure:
            closure[h] = set()  # an include cycle stops here
            for i in includes[h]:
                closure[h] |= {i} | close(i)
        return closure[h]

    for h in text:
        close(h)
    direct = {h for h, t in text.items() if re.search(r"^#include\s+<(torch|ATen|c10)/", t, re.M)}
    torch = {h for h in text if h in direct or closure[h] & direct}

    def chains(group):
        group = sorted(group)
        after = {a: [b for b in group if a in closure[b]] for a in group}  # b includes a
        matched = {}  # b -> the a just before it in its chain

        def augment(a, seen):
            for b in after[a]:
                if b not in seen:
                    seen.add(b)
                    if b not in matched or augment(matched[b], seen):
                        matched[b] = a
                        return True
            return False

        for a in group:
            augment(a, set())
        following = {a: b for b, a in matched.items()}
        result = []
        for start in (h for h in group if h not in matched):
            chain = [start]
            while chain[-1] in following:
                chain.append(following[chain[-1]])
            result.append(chain)
        return result

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".cpp"):
            os.remove(os.path.join(out, f))
    for name, group in (("torch", torch), ("plain", set(text) - torch)):
        units = []
        for chain in chains(group):
            unit = os.path.join(out, re.sub(r"\W", "_", chain[0]) + ".cpp")
            with open(unit, "w", encoding="utf-8") as fh:
                fh.write("// Each header includes every one above it (tests/build/header_chains.py).\n")
                fh.writelines(f'#include "{h}"\n' for h in chain)
            units.append(unit.replace(os.sep, "/"))
        print(",".join([name] + units))


if __name__ == "__main__":
    main()
