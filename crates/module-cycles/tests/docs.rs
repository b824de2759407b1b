//! The documentation's links hold: every relative link in a Markdown file
//! of the tree (README.md, docs/, bench/RESULTS.md, and any added later)
//! names a file or directory that exists, and a link to a heading
//! (`page.md#heading`) names a heading that page has. Also: README.md
//! stays a front door (the two commands near its top, a bounded length),
//! and docs/README.md indexes every page of docs/.
//!
//! Links are Markdown's inline ones (`[text](target)`, `![alt](target)`)
//! and reference definitions (`[label]: target`), outside code blocks and
//! code spans; web addresses (`https:`, `mailto:` ...) are not followed.
//! A heading's anchor is the one GitHub makes: the heading's text in
//! lower case, without punctuation, spaces turned into hyphens, `-1`,
//! `-2` ... after a repeated one; `<a id="...">` and `<a name="...">`
//! define anchors too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// README's two commands, which its quick start must keep (issue 44).
const README_COMMANDS: [&str; 2] = [
    "cargo run --release -p trireme -- node run --data-dir ./trireme-data --demo",
    "cargo test --workspace",
];
/// "Near the top": both commands within this many lines of README.md.
const README_COMMANDS_WITHIN_LINES: usize = 70;
/// README is a front door, not the manual: about 150 lines (issue 44,
/// item 6). What does not fit goes to docs/.
const README_MAX_LINES: usize = 160;

/// One link found in a Markdown file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

fn repository_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Every `.md` file under `root`, skipping build output, installed
/// packages and hidden directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut directories = vec![root.to_path_buf()];
    while let Some(directory) = directories.pop() {
        let entries = std::fs::read_dir(&directory)
            .unwrap_or_else(|error| panic!("cannot list {}: {error}", directory.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    directories.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The lines of `text` outside fenced code blocks, with their numbers
/// (from 1).
fn lines_outside_fences(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut fence: Option<&str> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"]
            .into_iter()
            .find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// [`lines_outside_fences`] with code spans blanked out: where links are.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    lines_outside_fences(text)
        .into_iter()
        .map(|(number, line)| (number, without_code_spans(line)))
        .collect()
}

/// `line` with each code span (`` `...` ``) replaced by spaces: a path in
/// code is text, not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for character in line.chars() {
        if character == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(character);
        }
    }
    out
}

/// The links of a Markdown text.
fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (line, prose) in prose_lines(text) {
        for target in inline_targets(&prose) {
            found.push(Link { line, target });
        }
        if let Some(target) = reference_target(&prose) {
            found.push(Link { line, target });
        }
    }
    found
}

/// The targets of `[text](target)` and `![alt](target)` on one line.
fn inline_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = closing_parenthesis(after) else {
            break;
        };
        targets.push(link_destination(&after[..end]));
        rest = &after[end..];
    }
    targets
}

/// Where the parenthesis that ends a link's destination is, counting
/// nested pairs (`page.md#a-(b)` is one destination).
fn closing_parenthesis(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (index, character) in text.char_indices() {
        match character {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(index),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The destination of a link's parentheses, without a title
/// (`page.md "Title"`) or angle brackets (`<my page.md>`).
fn link_destination(inside: &str) -> String {
    let inside = inside.trim();
    if let Some(bracketed) = inside.strip_prefix('<') {
        return bracketed.split('>').next().unwrap_or("").to_string();
    }
    inside.split_whitespace().next().unwrap_or("").to_string()
}

/// The target of a reference definition (`[label]: target`), if the line
/// is one.
fn reference_target(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (label, after) = rest.split_once("]:")?;
    if label.is_empty() || label.contains('[') {
        return None;
    }
    Some(link_destination(after))
}

/// Whether a link leaves the tree (a web address, mail), and so is not
/// checked here.
fn is_external(target: &str) -> bool {
    let scheme_end = target.find(':');
    let path_start = target.find(['/', '#']);
    match (scheme_end, path_start) {
        (Some(colon), Some(slash)) => colon < slash,
        (Some(_), None) => true,
        _ => false,
    }
}

/// GitHub's anchor for a heading's text: lower case, inline markup and
/// punctuation dropped, spaces turned into hyphens.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link in a heading contributes its text only.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.split_once("](") {
            Some((label, tail)) if closing_parenthesis(tail).is_some() => {
                text.push_str(label);
                rest = &tail[closing_parenthesis(tail).expect("checked") + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown text defines: its headings' (repeats numbered
/// as GitHub does) and explicit `<a id>` / `<a name>` ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    // A heading's code spans count with their text: `x` anchors as x.
    for (_, line) in lines_outside_fences(text) {
        for attribute in ["id=\"", "name=\""] {
            for piece in line.split("<a ").skip(1) {
                if let Some(value) = piece.split(attribute).nth(1) {
                    found.insert(value.split('"').next().unwrap_or("").to_string());
                }
            }
        }
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let base = slug(trimmed[level..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut repeat = 0;
        while found.contains(&anchor) {
            repeat += 1;
            anchor = format!("{base}-{repeat}");
        }
        found.insert(anchor);
    }
    found
}

/// `%20` and the like in a link's path, decoded.
fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                index += 3;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with `link` in `file`, if anything.
fn check_link(file: &Path, text: &str, link: &Link) -> Option<String> {
    if link.target.is_empty() {
        return Some("an empty link".to_string());
    }
    if is_external(&link.target) {
        return None;
    }
    let (path, fragment) = match link.target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (link.target.as_str(), None),
    };
    let target = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent()
            .expect("a file has a directory")
            .join(percent_decoded(path))
    };
    if !target.exists() {
        return Some(format!("`{}`: no such file or directory", link.target));
    }
    let fragment = fragment.filter(|fragment| !fragment.is_empty())?;
    let is_markdown = target.extension().is_some_and(|ext| ext == "md");
    if !is_markdown {
        return None;
    }
    let page = if path.is_empty() {
        text.to_string()
    } else {
        std::fs::read_to_string(&target).ok()?
    };
    let fragment = percent_decoded(fragment).to_lowercase();
    (!anchors(&page).contains(&fragment)).then(|| {
        format!(
            "`{}`: {} has no heading (or <a id>) with the anchor `#{fragment}`",
            link.target,
            target.display()
        )
    })
}

/// Every broken link under `root`, as `FILE:LINE: what is wrong`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for link in links(&text) {
            if let Some(problem) = check_link(&file, &text, &link) {
                problems.push(format!("{shown}:{}: {problem}", link.line));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repository_root();
    let files = markdown_files(&root);
    assert!(
        files.iter().any(|file| file.ends_with("docs/README.md")),
        "found no docs/README.md among {files:?}"
    );
    let problems = broken_links(&root);
    assert!(
        problems.is_empty(),
        "broken links (fix the link, or the heading it names):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_link_check_catches_a_missing_file_and_a_missing_heading() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let docs = root.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(
        docs.join("page.md"),
        "# A page\n\n## Install as a package\n\n## Tests\n\n## Tests\n\n## The `sim-store` binary\n",
    )
    .unwrap();
    std::fs::write(
        root.path().join("README.md"),
        "# Read me\n\
         [good](docs/page.md) [anchor](docs/page.md#install-as-a-package)\n\
         [repeat](docs/page.md#tests-1) [self](#read-me) [web](https://example.com/x.md)\n\
         [code](docs/page.md#the-sim-store-binary) `[in code](docs/nothing.md)`\n\
         ```\n[in a block](docs/nothing.md)\n```\n\
         [gone](docs/missing.md) ![picture](docs/img/missing.png)\n\
         [no heading](docs/page.md#install) [no repeat](docs/page.md#tests-2)\n\
         [ref]: docs/also-missing.md\n",
    )
    .unwrap();
    let problems = broken_links(root.path());
    let expected = [
        "README.md:8: `docs/missing.md`: no such file or directory",
        "README.md:8: `docs/img/missing.png`: no such file or directory",
        "README.md:9: `docs/page.md#install`",
        "README.md:9: `docs/page.md#tests-2`",
        "README.md:10: `docs/also-missing.md`: no such file or directory",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, expected) in problems.iter().zip(expected) {
        assert!(problem.starts_with(expected), "{problem} is not {expected}");
    }
}

#[test]
fn headings_get_githubs_anchors() {
    assert_eq!(slug("Install as a package"), "install-as-a-package");
    assert_eq!(
        slug("Metrics cost (4k randwrite QD32, with and without the `metrics` feature)"),
        "metrics-cost-4k-randwrite-qd32-with-and-without-the-metrics-feature"
    );
    assert_eq!(slug("trireme / qemu-nbd"), "trireme--qemu-nbd");
    assert_eq!(slug("J5 1.08× qemu-nbd, *met*"), "j5-108-qemu-nbd-met");
    assert_eq!(slug("See [the store](store-format.md)"), "see-the-store");
}

#[test]
fn the_readme_gives_the_two_commands_near_the_top() {
    let text = std::fs::read_to_string(repository_root().join("README.md")).expect("README.md");
    let lines: Vec<&str> = text.lines().collect();
    for command in README_COMMANDS {
        let at = lines.iter().position(|line| line.trim() == command);
        assert!(
            at.is_some_and(|at| at < README_COMMANDS_WITHIN_LINES),
            "README.md must give `{command}` on a line of its own within its first {README_COMMANDS_WITHIN_LINES} lines (found at line {:?})",
            at.map(|at| at + 1)
        );
    }
    assert!(
        lines.len() <= README_MAX_LINES,
        "README.md has {} lines; it is the front door (at most {README_MAX_LINES}): move the detail to a page of docs/ and link it",
        lines.len()
    );
}

#[test]
fn the_docs_index_lists_every_page() {
    let docs = repository_root().join("docs");
    let index = std::fs::read_to_string(docs.join("README.md")).expect("docs/README.md");
    let linked: BTreeSet<String> = links(&index)
        .into_iter()
        .map(|link| link.target.split('#').next().unwrap_or("").to_string())
        .collect();
    let missing: Vec<String> = std::fs::read_dir(&docs)
        .expect("docs/")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md") && name != "README.md" && !linked.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/README.md does not list {missing:?}: give each page a line there"
    );
}
