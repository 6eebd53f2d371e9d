"""Build assets/c4_test/data.json (JSON lines, {"text": ...}) from torchtitan's own docs.

torchtitan's real tests/assets/c4_test/data.json is absent from the local mirror, so this
writes a stand-in with the same schema that the "c4_test" loader (load_dataset(path)) reads.
"""
import json, subprocess, sys
git_dir, out = sys.argv[1], sys.argv[2]
files = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", "HEAD"],
                       capture_output=True, text=True, check=True).stdout.split()
files = [f for f in files if f.endswith(".md") and (f.startswith("docs/") or f == "README.md"
         or f.startswith("torchtitan/") and "/.claude/" not in f)]
n = 0
with open(out, "w") as fh:
    for f in sorted(files):
        r = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{f}"], capture_output=True, text=True)
        if r.returncode:
            continue
        for para in r.stdout.split("\n\n"):
            para = para.strip()
            if len(para) > 200:
                fh.write(json.dumps({"text": para}) + "\n"); n += 1
print(n, "records")
