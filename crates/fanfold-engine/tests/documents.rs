//! Folders and documents as input: the canonical stream, and the `files`,
//! `email`, `markdown` and `code` partitions over it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::Read;
use std::path::Path;

use fanfold_core::spec::PartitionSpec;
use fanfold_engine::folder::DocumentStream;
use fanfold_ops::partition::{self, PartUnit, PartitionOptions, Rejection};
use serde_json::Value;

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("dir");
    }
    std::fs::write(path, bytes).expect("write");
}

fn stream(root: &Path, spec: &PartitionSpec) -> Vec<u8> {
    let glob = spec.document_glob().expect("a document format");
    let mut bytes = Vec::new();
    DocumentStream::open(root, glob)
        .expect("opens")
        .read_to_end(&mut bytes)
        .expect("reads");
    bytes
}

/// Partitions the folder, and checks what holds for every document
/// format: coverage is complete, and each unit reads back from its own
/// bytes to the value it was given.
fn parts(root: &Path, spec: &PartitionSpec) -> (Vec<PartUnit>, Vec<Rejection>) {
    let src = stream(root, spec);
    let (units, rejected, coverage) =
        partition::partition_all(spec, &src, PartitionOptions::default()).expect("partitions");
    assert!(coverage.is_complete(), "{coverage:?}");
    assert_eq!(coverage.units as usize, units.len());
    for u in &units {
        assert_eq!(u.unit.unit_hash, partition::content_hash(spec, &u.value));
        let r = u.unit.bytes;
        let bytes = &src[r.start as usize..r.end as usize];
        let back =
            partition::reread(spec, bytes, None, 0, u.unit.unit_id.as_str()).expect("reads back");
        assert_eq!(back, u.value, "unit {}", u.unit.unit_id.as_str());
    }
    (units, rejected)
}

fn ids(units: &[PartUnit]) -> Vec<&str> {
    units.iter().map(|u| u.unit.unit_id.as_str()).collect()
}

fn field<'a>(u: &'a PartUnit, name: &str) -> &'a str {
    u.value.get(name).and_then(Value::as_str).unwrap_or("")
}

fn files() -> PartitionSpec {
    PartitionSpec::Files {
        glob: None,
        kind: "file".into(),
    }
}

#[test]
fn a_folder_is_one_unit_a_file_and_unreadable_files_are_rejections_by_name() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    write(root, "b.txt", b"second");
    write(
        root,
        "a.txt",
        "\u{feff}first, with a byte order mark".as_bytes(),
    );
    write(root, "sub/c.txt", b"third");
    write(root, ".git/config", b"hidden, never read");
    write(root, "logo.png", b"\x89PNG\r\n\x1a\n\x00\x00");
    write(root, "latin1.txt", b"caf\xe9 au lait");
    std::os::unix::fs::symlink(root.join("b.txt"), root.join("link.txt")).expect("symlink");
    let (units, rejected) = parts(root, &files());
    assert_eq!(ids(&units), ["a.txt", "b.txt", "link.txt", "sub/c.txt"]);
    assert_eq!(field(&units[2], "text"), "second");
    assert_eq!(field(&units[0], "text"), "first, with a byte order mark");
    assert_eq!(units[3].value["size"], 5);
    assert!(field(&units[3], "modified").ends_with('Z'));
    let why: Vec<(&str, &str)> = rejected
        .iter()
        .map(|r| (r.reason.as_str(), r.detail.as_str()))
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert_eq!(why[0].0, "not_utf8");
    assert!(
        why[0].1.contains("latin1.txt") && why[0].1.contains("byte 3"),
        "{why:?}"
    );
    assert_eq!(why[1].0, "binary");
    assert!(why[1].1.contains("logo.png"), "{why:?}");
}

#[test]
fn an_edited_file_is_one_changed_unit_and_a_glob_narrows_the_folder() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    for n in 0..5 {
        write(
            root,
            &format!("notes/{n}.txt"),
            format!("note {n}").as_bytes(),
        );
    }
    write(root, "notes/readme.md", b"# not a note");
    let spec = PartitionSpec::Files {
        glob: Some("notes/*.txt".into()),
        kind: "file".into(),
    };
    let (before, _) = parts(root, &spec);
    assert_eq!(before.len(), 5);
    let source_before = blake3::hash(&stream(root, &spec));
    write(root, "notes/3.txt", b"note 3, edited");
    let (after, _) = parts(root, &spec);
    let changed: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(a, b)| a.unit.unit_hash != b.unit.unit_hash)
        .map(|(a, _)| a.unit.unit_id.as_str())
        .collect();
    assert_eq!(changed, ["notes/3.txt"]);
    assert_ne!(source_before, blake3::hash(&stream(root, &spec)));
    // A file touched, not edited, is the same unit: the time is a field,
    // not part of what the unit is.
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(root.join("notes/1.txt"))
        .and_then(|f| f.set_modified(old))
        .expect("touch");
    let (touched, _) = parts(root, &spec);
    assert_eq!(touched[1].value["modified"], "2001-09-09T01:46:40Z");
    assert_eq!(touched[1].unit.unit_hash, after[1].unit.unit_hash);
    let none = PartitionSpec::Files {
        glob: Some("*.pdf".into()),
        kind: "file".into(),
    };
    let err = partition::partition_all(&none, &stream(root, &none), PartitionOptions::default())
        .expect_err("no file matches");
    assert!(err.to_string().contains("*.pdf"), "{err}");
}

const MESSAGE: &str = "From: Dana Ortiz <dana@example.org>\nTo: oncall@example.org\nSubject: Payments API down\nDate: Tue, 03 Nov 2026 02:41:07 +0000\nMessage-ID: <m1@example.org>\n\nI was paged at 02:14 and rolled back.\n";

#[test]
fn messages_give_their_headers_as_fields_and_their_body_as_text() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    write(root, "inbox/1.eml", MESSAGE.as_bytes());
    write(
        root,
        "inbox/notes.txt",
        b"just some words\nwith no headers\n",
    );
    let mbox = "From dana@example.org Tue Nov  3 02:41:07 2026\n\
        From: Dana <dana@example.org>\nSubject: First\nMessage-ID: <a@x>\n\nbody one\n\n\
        From sam@example.org Tue Nov  3 03:00:00 2026\n\
        From: Sam <sam@example.org>\nSubject: Second\nMessage-ID: <a@x>\n\nbody two\n\n\
        From sam@example.org Tue Nov  3 04:00:00 2026\n\
        From: Sam <sam@example.org>\nSubject: Third\n\n>From the archive\n";
    write(root, "archive.mbox", mbox.as_bytes());
    let spec = PartitionSpec::Email {
        glob: None,
        kind: "message".into(),
    };
    let (units, rejected) = parts(root, &spec);
    assert_eq!(
        ids(&units),
        [
            "archive.mbox#a@x",
            "archive.mbox#a@x-2",
            "archive.mbox#3",
            "inbox/1.eml"
        ]
    );
    let one = &units[3];
    assert_eq!(field(one, "from"), "Dana Ortiz <dana@example.org>");
    assert_eq!(field(one, "subject"), "Payments API down");
    assert_eq!(field(one, "message_id"), "m1@example.org");
    assert_eq!(field(one, "date"), "2026-11-03T02:41:07Z");
    assert_eq!(field(one, "body"), "I was paged at 02:14 and rolled back.");
    assert!(!field(one, "body").contains("Subject"));
    assert_eq!(field(&units[2], "body"), "From the archive");
    assert_eq!(units[1].value["message"], 2);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "not_email");
    assert!(rejected[0].detail.contains("inbox/notes.txt"));
}

#[test]
fn markdown_sections_are_keyed_by_their_heading_path() {
    let dir = tempfile::tempdir().expect("dir");
    let text = "Intro words.\n\n# Guide\n\nOverview.\n\n## Install\n\n```sh\n# not a heading\ncargo build\n```\n\n## Usage\n\nRun it.\n\n# Guide\n\nAgain.\n\nSetext\n------\n\nUnder.\n";
    write(dir.path(), "docs/guide.md", text.as_bytes());
    write(dir.path(), "docs/skip.txt", b"# not markdown by name\n");
    let spec = PartitionSpec::Markdown {
        glob: None,
        kind: "section".into(),
    };
    let (units, rejected) = parts(dir.path(), &spec);
    assert!(rejected.is_empty());
    assert_eq!(
        ids(&units),
        [
            "docs/guide.md",
            "docs/guide.md#Guide",
            "docs/guide.md#Guide/Install",
            "docs/guide.md#Guide/Usage",
            "docs/guide.md#Guide-2",
            "docs/guide.md#Guide/Setext",
        ]
    );
    let install = &units[2];
    assert!(field(install, "text").contains("# not a heading"));
    let (start, end) = (
        install.value["start"].as_u64().expect("start") as usize,
        install.value["end"].as_u64().expect("end") as usize,
    );
    assert_eq!(&text[start..end], field(install, "text"));
    assert_eq!(install.value["line"], 7);
    assert_eq!(install.value["level"], 2);
}

#[test]
fn code_is_split_into_symbols_with_their_comments() {
    let dir = tempfile::tempdir().expect("dir");
    let rust = "use std::fmt;\n\n/// A point.\n#[derive(Debug)]\npub struct Point { x: i32 }\n\nimpl Point {\n    /// Its x.\n    pub fn x(&self) -> i32 { self.x }\n}\n\nimpl fmt::Display for Point {\n    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result { write!(f, \"{}\", self.x) }\n}\n\nmod inner {\n    fn helper() {}\n}\n\nfn main() {}\n";
    let python = "import os\n\n# Greets.\n@cache\ndef greet(name):\n    return name\n\nclass Store:\n    def get(self, k):\n        return k\n\n    def put(self, k, v):\n        pass\n\nclass Empty:\n    pass\n";
    write(dir.path(), "src/lib.rs", rust.as_bytes());
    write(dir.path(), "tool/app.py", python.as_bytes());
    write(
        dir.path(),
        "src/empty.rs",
        b"// nothing here\nuse std::io;\n",
    );
    let spec = PartitionSpec::Code {
        glob: None,
        kind: "symbol".into(),
    };
    let (units, rejected) = parts(dir.path(), &spec);
    assert_eq!(
        ids(&units),
        [
            "src/lib.rs#Point",
            "src/lib.rs#Point::x",
            "src/lib.rs#<Point as fmt::Display>::fmt",
            "src/lib.rs#inner::helper",
            "src/lib.rs#main",
            "tool/app.py#greet",
            "tool/app.py#Store.get",
            "tool/app.py#Store.put",
            "tool/app.py#Empty",
        ]
    );
    let point = &units[0];
    assert!(field(point, "text").starts_with("/// A point.\n#[derive(Debug)]"));
    assert_eq!(field(point, "symbol_kind"), "struct");
    assert!(field(&units[1], "text").starts_with("/// Its x."));
    assert_eq!(field(&units[1], "symbol_kind"), "method");
    assert!(field(&units[5], "text").starts_with("# Greets.\n@cache\ndef greet"));
    assert_eq!(field(&units[5], "language"), "python");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "empty");
    assert!(rejected[0].detail.contains("src/empty.rs"));
}

#[test]
fn a_latin1_message_is_decoded_by_its_charset_where_files_rejects_it() {
    let dir = tempfile::tempdir().expect("dir");
    let mut raw = b"From: Ana <ana@example.org>\nSubject: caf".to_vec();
    raw.push(0xE9);
    raw.extend_from_slice(b"\nDate: Tue, 03 Nov 2026 02:41:07 +0000\nContent-Type: text/plain; charset=iso-8859-1\n\nLe caf");
    raw.push(0xE9);
    raw.extend_from_slice(b" est ferm");
    raw.push(0xE9);
    raw.extend_from_slice(b".\n");
    write(dir.path(), "old.eml", &raw);
    let email = PartitionSpec::Email {
        glob: None,
        kind: "message".into(),
    };
    let (units, rejected) = parts(dir.path(), &email);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(field(&units[0], "body"), "Le café est fermé.");
    let (units, rejected) = parts(dir.path(), &files());
    assert!(units.is_empty());
    assert_eq!(rejected[0].reason, "not_utf8");
}

/// Read-back numbers a document's repeated ids as the partition did, even
/// when an earlier repeat was too large to be a unit; a repeat across
/// documents is rejected, never renamed.
#[test]
fn repeated_ids_read_back_to_the_same_unit_and_cross_document_repeats_are_rejected() {
    let dir = tempfile::tempdir().expect("dir");
    let long = format!("# A\n\n{}\n\n# A\n\nshort\n", "word ".repeat(60));
    write(dir.path(), "d.md", long.as_bytes());
    write(dir.path(), "n.md", b"# x.md\n\nbody\n");
    write(dir.path(), "n.md#x.md", b"just text\n");
    let spec = PartitionSpec::Markdown {
        glob: None,
        kind: "section".into(),
    };
    let src = stream(dir.path(), &spec);
    let options = PartitionOptions {
        max_unit_bytes: 100,
    };
    let (units, rejected, coverage) =
        partition::partition_all(&spec, &src, options).expect("partitions");
    assert!(coverage.is_complete());
    assert_eq!(ids(&units), ["d.md#A-2", "n.md#x.md"]);
    for u in &units {
        let r = u.unit.bytes;
        let back = partition::reread(
            &spec,
            &src[r.start as usize..r.end as usize],
            None,
            0,
            u.unit.unit_id.as_str(),
        )
        .expect("reads back");
        assert_eq!(back, u.value);
    }
    let reasons: Vec<&str> = rejected.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["too_large", "duplicate_key"]);
}

#[test]
fn front_matter_bad_messages_and_odd_names_do_not_spoil_the_rest() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    write(
        root,
        "post.md",
        b"---\ntitle: Foo\ndate: 2020\n---\n\n# Real\n\ntext\n",
    );
    let (units, _) = parts(
        root,
        &PartitionSpec::Markdown {
            glob: None,
            kind: "section".into(),
        },
    );
    assert_eq!(ids(&units).last(), Some(&"post.md#Real"));
    assert!(!ids(&units).iter().any(|id| id.contains("title")));
    // An mbox body line `From ...` that was not escaped splits off a part
    // with no headers: that part alone is rejected.
    let mbox = "From a@x Tue Nov  3 02:41:07 2026\nFrom: A <a@x>\nSubject: One\nMessage-ID: <1@x>\n\nHello\nFrom the desk of A, more words\n\nFrom b@x Tue Nov  3 03:00:00 2026\nFrom: B <b@x>\nSubject: Two\nMessage-ID: <2@x>\n\nBye\n";
    let mail = tempfile::tempdir().expect("dir");
    write(mail.path(), "box.mbox", mbox.as_bytes());
    let (units, rejected) = parts(
        mail.path(),
        &PartitionSpec::Email {
            glob: None,
            kind: "message".into(),
        },
    );
    assert_eq!(ids(&units), ["box.mbox#1@x", "box.mbox#2@x"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "not_email");
    assert!(
        rejected[0].detail.contains("box.mbox#2"),
        "{}",
        rejected[0].detail
    );
    // A type written over several lines is one readable id; a dangling
    // link is a rejection naming it, and the folder's other files stand.
    let code = tempfile::tempdir().expect("dir");
    write(
        code.path(),
        "lib.rs",
        b"impl From<\n    Vec<u8>,\n> for Bytes {\n    fn from(v: Vec<u8>) -> Self { Bytes(v) }\n}\n",
    );
    std::os::unix::fs::symlink(code.path().join("gone.rs"), code.path().join("dangling.rs"))
        .expect("symlink");
    let (units, rejected) = parts(
        code.path(),
        &PartitionSpec::Code {
            glob: None,
            kind: "symbol".into(),
        },
    );
    assert_eq!(ids(&units), ["lib.rs#<Bytes as From< Vec<u8>, >>::from"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "unreadable");
    assert!(rejected[0].detail.contains("dangling.rs"));
}
