//! The documentation holds together: every relative link and image of `README.md`,
//! `docs/*.md` and `policies/README.md` names a file or folder that exists (resolved
//! from the page that links), and a link to a heading (`page.md#anchor`, or `#anchor`
//! on the same page) names one of that page's headings by GitHub's slug. The README
//! stays a front page (at most 250 lines), and the docs index lists every page.
//!
//! Links are read with pulldown-cmark, so a link written inside a code block or a code
//! span is text, not a link, as on GitHub. Web and mail links are not followed.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The pages checked: the front page, every page of `docs/`, the policy authors' guide.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("policies/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// A path as the repository names it.
fn shown(path: &Path) -> String {
    let root = root();
    let path = path.strip_prefix(&root).unwrap_or(path);
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir if parts.last().is_some() => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str()),
        }
    }
    parts.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/")
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_FOOTNOTES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS
}

/// A link or image target, with the line it is written on.
struct Link {
    line: usize,
    target: String,
}

fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        if let Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) = event {
            let line = text[..range.start].matches('\n').count() + 1;
            found.push(Link { line, target: dest_url.to_string() });
        }
    }
    found
}

/// GitHub's anchor for a heading: lower case; letters, digits, `-` and `_` kept, spaces
/// made `-`, everything else dropped; a repeated anchor gets `-1`, `-2`, ...
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a page's headings give.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, options()) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let mut anchor = base.clone();
                let mut n = 0;
                while anchors.contains(&anchor) {
                    n += 1;
                    anchor = format!("{base}-{n}");
                }
                anchors.insert(anchor);
            }
            _ => {}
        }
    }
    anchors
}

/// What is wrong with one link of `page`, if anything.
fn broken(page: &Path, text: &str, target: &str) -> Option<String> {
    let lower = target.to_ascii_lowercase();
    if ["http://", "https://", "mailto:"].iter().any(|scheme| lower.starts_with(scheme)) {
        return None;
    }
    if target.contains("://") {
        return Some("a scheme this test does not know".into());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let path = percent_encoding::percent_decode_str(path).decode_utf8_lossy().into_owned();
    let file = if path.is_empty() {
        page.to_path_buf()
    } else if path.starts_with('/') {
        return Some("an absolute path (GitHub resolves it from the site root, not the repository)".into());
    } else {
        page.parent().unwrap().join(&path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", shown(&file)));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let linked = if path.is_empty() { text.to_string() } else { std::fs::read_to_string(&file).unwrap() };
    let anchor = percent_encoding::percent_decode_str(anchor).decode_utf8_lossy().to_lowercase();
    let known = anchors(&linked);
    (!known.contains(&anchor)).then(|| format!("no heading of {} has the anchor #{anchor}", shown(&file)))
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        for link in links(&text) {
            checked += 1;
            if let Some(why) = broken(&page, &text, &link.target) {
                failures.push(format!("{}:{}: ({}) {why}", shown(&page), link.line, link.target));
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: is the parser reading the pages?");
    assert!(failures.is_empty(), "{} broken links:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: the manual belongs in docs/"
    );
}

#[test]
fn the_docs_index_lists_every_page() {
    let index = std::fs::read_to_string(root().join("docs/README.md")).unwrap();
    let listed: BTreeSet<String> = links(&index).into_iter().map(|l| l.target).collect();
    for page in pages().iter().filter(|p| p.parent().unwrap().ends_with("docs")) {
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        if name != "README.md" {
            assert!(listed.contains(&name), "docs/README.md does not link to {name}");
        }
    }
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(slug("Exactly once: idempotency keys and crashes"), "exactly-once-idempotency-keys-and-crashes");
    assert_eq!(slug("The store's writer"), "the-stores-writer");
    assert_eq!(slug("Write · Test"), "write--test");
    assert_eq!(slug("`gateway_client` and HTTPS"), "gateway_client-and-https");
    let twice = anchors("# A\n\n## A\n\n```sh\n# not a heading\n```\n");
    assert_eq!(twice, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
}
