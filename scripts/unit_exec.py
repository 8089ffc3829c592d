#!/usr/bin/env python3
"""Print the argv of a systemd unit's ExecStart as systemd would run it, NUL-separated, for
scripts/test_ops.sh: `${VAR}` is one word (the value as it is), a `$VAR` word is split on
whitespace (systemd.service(5), "Command lines"), variables come from the unit's
EnvironmentFile (KEY=VALUE lines) and the environment given here. PREFIX=DIR maps the
absolute paths /etc/rlark and /usr/local into an install root (install.sh --destdir DIR).

  unit_exec.py UNIT [--env-file FILE] [--root DIR] [VAR=VALUE...]
"""

import re
import sys


def main():
    args = sys.argv[1:]
    unit, env, root = args.pop(0), {}, ""
    while args:
        arg = args.pop(0)
        if arg == "--env-file":
            for line in open(args.pop(0)):
                line = line.strip()
                if line and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    env[key] = value
        elif arg == "--root":
            root = args.pop(0)
        else:
            key, _, value = arg.partition("=")
            env[key] = value
    lines = [l for l in open(unit) if l.startswith("ExecStart=")]
    if len(lines) != 1:
        sys.exit(f"{unit}: one ExecStart= expected, found {len(lines)}")
    argv = []
    for word in lines[0][len("ExecStart="):].split():
        if m := re.fullmatch(r"\$\{(\w+)\}", word):
            argv.append(env.get(m.group(1), ""))
        elif m := re.fullmatch(r"\$(\w+)", word):
            argv.extend(env.get(m.group(1), "").split())
        elif "$" in word:
            sys.exit(f"{unit}: unsupported variable use in {word!r}")
        else:
            if root:
                word = re.sub(r"^(/etc/rlark|/usr/local)(?=/|$)", lambda m: root + m.group(1), word)
            argv.append(word)
    sys.stdout.write("\0".join(argv) + "\0")


if __name__ == "__main__":
    main()
