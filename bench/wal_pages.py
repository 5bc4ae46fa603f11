"""Pages each commit wrote to a SQLite store's WAL, by the b-tree they belong to.

    python3 bench/wal_pages.py STORE.db      # reads STORE.db-wal beside it

Reads the WAL's frames from its start (the frames since the last checkpoint reset it)
until the first whose salt is not the header's, groups them into commits (a frame with a
database size closes one), and names each page by SQLite's `dbstat` of the store.
Frame checksums are not verified. Read a copy of the store and its WAL, taken after the
gateway was killed: the open made here reads the WAL too, and closing it checkpoints
the copy and removes the copy's WAL.
"""
import collections
import sqlite3
import struct
import sys

store = sys.argv[1]
wal = open(store + "-wal", "rb").read()
magic, _, page_size, _, salt1, salt2, _, _ = struct.unpack(">8I", wal[:32])
if magic not in (0x377F0682, 0x377F0683):
    sys.exit("not a SQLite WAL")
page_size = page_size if page_size > 1 else 65536
commits, frames, at = [], [], 32
while at + 24 + page_size <= len(wal):
    page, size_after, s1, s2, _, _ = struct.unpack(">6I", wal[at:at + 24])
    if (s1, s2) != (salt1, salt2):
        break
    frames.append(page)
    if size_after:
        commits.append(frames)
        frames = []
    at += 24 + page_size
if not commits:
    sys.exit("no commit in the WAL")
names = dict(sqlite3.connect(store).execute("SELECT pageno, name FROM dbstat"))
pages = collections.Counter()
for commit in commits:
    for page in set(commit):
        pages[names.get(page, "(free or not in a b-tree)")] += 1
n = len(commits)
print(f"{n} commits, {sum(len(c) for c in commits) / n:.1f} frames a commit")
for name, count in pages.most_common():
    print(f"{count / n:7.2f}  {name}")
