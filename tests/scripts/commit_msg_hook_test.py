#!/usr/bin/env python3
"""scripts/git-hooks/commit-msg on good and bad messages: a subject of 72 characters passes and one
of 73 is refused with its length, a subject run into the body is refused, comment lines and what
follows `git commit -v`'s scissors line are ignored, subjects git writes itself (merges, reverts,
fixup!) pass; and a real `git commit` in a scratch repository with core.hooksPath set to
scripts/git-hooks is refused, then accepted. (Run by CTest as commit_msg_hook_test.)"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS = os.path.join(ROOT, "scripts", "git-hooks")
HOOK = os.path.join(HOOKS, "commit-msg")
SCISSORS = "# ------------------------ >8 ------------------------"

GOOD = [
    "s" * 72 + "\n\nWhy, and what was measured.\n",
    "A subject alone\n",
    "Subject\n\nBody\nwith lines\n",
    "# Please enter the commit message for your changes.\n\nSubject after comments\n\nBody\n",
    "Subject, then a verbose commit's diff\n" + SCISSORS + "\ndiff --git a/x b/x\n",
    "Subject with trailing spaces" + " " * 60 + "\n",
    "Merge branch 'h-" + "x" * 80 + "' into main\n",
    'Revert "' + "y" * 70 + '"\n\nThis reverts commit 0123456.\n',
    "fixup! " + "z" * 70 + "\n",
    "",  # git aborts an empty message itself
]
BAD = [
    ("s" * 73 + "\n\nBody\n", "73 characters"),
    ("Subject\nrun into the body\n", "blank line"),
    ("ü" * 40 + "—" * 33 + "\n", "73 characters"),  # characters, not bytes
    ("Merge the readers into one place, which is a subject a person wrote by hand\n",
     "characters"),
]


def run_hook(message):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".msg", delete=False) as f:
        f.write(message)
    try:
        p = subprocess.run([sys.executable, HOOK, f.name], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stderr


def check_messages():
    failures = []
    for m in GOOD:
        rc, err = run_hook(m)
        if rc != 0:
            failures.append(f"refused a good message {m[:40]!r}: {err.strip()}")
    for m, reason in BAD:
        rc, err = run_hook(m)
        if rc != 1 or reason not in err:
            failures.append(f"bad message {m[:40]!r}: rc {rc}, stderr {err.strip()!r}, "
                            f"expected rc 1 naming {reason!r}")
    return failures


def check_git_commit():
    """The hook as git runs it, through core.hooksPath."""
    if shutil.which("git") is None:
        return ["git is not installed"]
    d = tempfile.mkdtemp(prefix="commit_msg_hook_test.")
    try:
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
                   GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
                   GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")

        def git(*args):
            return subprocess.run(["git", "-C", d, *args], capture_output=True, text=True, env=env,
                                  timeout=30)

        git("init", "-q")
        git("config", "core.hooksPath", HOOKS)
        with open(os.path.join(d, "f"), "w") as f:
            f.write("x\n")
        git("add", "f")
        failures = []
        refused = git("commit", "-q", "-m", "l" * 80)
        if refused.returncode == 0 or "80 characters" not in refused.stderr:
            failures.append(f"git commit with an 80-character subject: rc {refused.returncode}, "
                            f"stderr {refused.stderr.strip()!r}")
        accepted = git("commit", "-q", "-m", "A short subject", "-m", "Why.")
        if accepted.returncode != 0:
            failures.append(f"git commit with a good message failed: {accepted.stderr.strip()}")
        return failures
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    failures = check_messages() + check_git_commit()
    for f in failures:
        print(f"FAIL: {f}")
    print(f"{len(GOOD) + len(BAD) + 2} cases, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
