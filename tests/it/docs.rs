//! The documentation against the code: the problem codes table is made
//! from `ProblemCode` (run with `TXGATE_BLESS_DOCS=1` to write it), the
//! metrics and configuration tables list exactly what a gateway registers
//! and reads, every relative link in the README and `docs/` resolves to a
//! file and heading that exist, and every design citation in the code
//! names a section of `docs/design.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::{Backend, TestApp};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown page: the README and everything under `docs/`.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push(line);
        }
    }
    out
}

/// The anchors GitHub gives the headings of `text`: lower case, spaces to
/// `-`, punctuation other than `-` and `_` dropped, repeats numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of the inline links of `text` (outside code).
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Inline code may hold `](` that is not a link.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_owned());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_link_in_the_docs_resolves() {
    let mut dead = Vec::new();
    let pages = pages();
    assert!(pages.len() > 5, "the docs are found: {pages:?}");
    for page in &pages {
        let text = read(page);
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let linked = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !linked.exists() {
                dead.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && linked.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&linked)).contains(anchor)
            {
                dead.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn the_readme_fits_and_links_every_page_and_the_benchmarks_every_run() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 250, "the README has {lines} lines");
    let linked: BTreeSet<PathBuf> = links(&readme)
        .iter()
        .filter(|t| !t.starts_with("http"))
        .map(|t| root().join(t.split('#').next().unwrap()))
        .collect();
    // The bench's runs (docs/bench-runs/, written by scripts/bench) are
    // data, linked from the benchmarks page instead.
    let runs = root().join("docs/bench-runs");
    for page in pages().into_iter().filter(|p| p.starts_with(root().join("docs")) && !p.starts_with(&runs)) {
        assert!(linked.contains(&page), "the README does not link {}", page.display());
    }
    let benchmarks = read(&root().join("docs/benchmarks.md"));
    let listed: BTreeSet<PathBuf> = links(&benchmarks)
        .iter()
        .filter(|t| !t.starts_with("http"))
        .map(|t| root().join("docs").join(t.split('#').next().unwrap()))
        .collect();
    for run in pages().into_iter().filter(|p| p.starts_with(&runs)) {
        assert!(listed.contains(&run), "docs/benchmarks.md does not link {}", run.display());
    }
}

/// Every design citation in the code (`docs/design.md §N`) names a section
/// that exists, and none points outside the repository.
#[test]
fn design_citations_name_sections_of_the_design_document() {
    let design = read(&root().join("docs/design.md"));
    let sections: BTreeSet<String> = prose(&design)
        .iter()
        .filter_map(|l| l.strip_prefix("## "))
        .filter_map(|h| h.split('.').next())
        .map(str::to_owned)
        .collect();
    let mut bad = Vec::new();
    let mut cited = 0;
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
                out.push(path);
            }
        }
    }
    walk(&root().join("src"), &mut files);
    walk(&root().join("crates"), &mut files);
    walk(&root().join("tests"), &mut files);
    // This file names what it looks for.
    for file in files.into_iter().filter(|f| !f.ends_with("tests/it/docs.rs")) {
        let text = read(&file);
        for (n, line) in text.lines().enumerate() {
            if line.contains("DESIGN.md") || line.contains("DESIGN §") || line.contains("../shared") {
                bad.push(format!("{}:{}: cites a document outside the repository", file.display(), n + 1));
            }
            let mut rest = line;
            while let Some(at) = rest.find("docs/design.md §") {
                rest = &rest[at + "docs/design.md §".len()..];
                let section: String = rest.chars().take_while(char::is_ascii_digit).collect();
                cited += 1;
                if !sections.contains(&section) {
                    bad.push(format!("{}:{}: no section §{section}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(cited > 10, "the code cites the design document ({cited} citations)");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The rows of the Markdown table that follows the line `marker` in `text`.
fn table_after<'t>(text: &'t str, marker: &str) -> Vec<Vec<&'t str>> {
    let mut lines = text.lines().skip_while(|l| !l.contains(marker)).skip(1);
    let rows: Vec<Vec<&str>> = lines
        .by_ref()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim().trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert!(rows.len() > 2, "a table follows {marker:?}");
    rows.into_iter().skip(2).collect()
}

/// The first code span of a table cell.
fn code(cell: &str) -> &str {
    cell.split('`').nth(1).unwrap_or(cell)
}

const CODES_BEGIN: &str = "<!-- problem codes: generated from ProblemCode by tests/it/docs.rs -->";
const CODES_END: &str = "<!-- end of problem codes -->";

/// The problem codes table, as `ProblemCode` says.
fn codes_table() -> String {
    use txgate::testing::http::error::ProblemCode;
    let mut out = String::from("| status | code | schema | meaning |\n|---|---|---|---|\n");
    for code in ProblemCode::ALL {
        let schema = format!("{:?}", code.family());
        out += &format!("| {} | `{}` | `{schema}` | {} |\n", code.status(), code.as_str(), code.describe());
    }
    out
}

#[test]
fn the_problem_codes_table_is_the_code_s() {
    let path = root().join("docs/guides/errors.md");
    let text = read(&path);
    let (before, rest) = text.split_once(CODES_BEGIN).expect("the errors guide marks its generated table");
    let (_, after) = rest.split_once(CODES_END).expect("the generated table ends");
    let want = format!("{before}{CODES_BEGIN}\n{}{CODES_END}{after}", codes_table());
    if std::env::var_os("TXGATE_BLESS_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    assert!(
        text == want,
        "docs/guides/errors.md's problem codes differ from ProblemCode; \
         run `TXGATE_BLESS_DOCS=1 cargo test --test it docs::` to write them"
    );
}

/// The metrics table lists exactly the families a running gateway serves,
/// each with its type.
#[tokio::test]
async fn the_metrics_table_lists_every_family_a_gateway_serves() {
    let app = TestApp::spawn(Backend::Embedded).await.expect("an embedded gateway");
    let scrape = app.get("/metrics").await.text().await.unwrap();
    // A family with labels shows in a scrape once it has a sample: the
    // declared ones are taken as declared, those read at scrape time as
    // served.
    let mut served: BTreeMap<String, String> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    for family in txgate::testing::metrics::FAMILIES {
        served.insert(family.name.to_owned(), family.kind().to_owned());
    }
    let doc = read(&root().join("docs/operating.md"));
    let listed: BTreeMap<String, String> =
        table_after(&doc, "## Metrics").into_iter().map(|row| (code(row[0]).to_owned(), row[1].to_owned())).collect();
    assert_eq!(listed, served, "docs/operating.md's metrics table against what a gateway declares and serves");
    app.stop().await;
}

/// The configuration table lists exactly the `TXGATE_*` variables the
/// settings read.
#[test]
fn the_configuration_table_lists_every_variable() {
    use clap::CommandFactory;
    let command = txgate::config::Cli::command();
    let read_by_settings: BTreeSet<String> =
        command.get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect();
    assert!(read_by_settings.len() > 20, "the settings are found: {read_by_settings:?}");
    let doc = read(&root().join("docs/operating.md"));
    // Variables of other programs (RUST_LOG) may be listed too.
    let listed: BTreeSet<String> = table_after(&doc, "## Configuration")
        .into_iter()
        .flat_map(|row| row[0].split('`').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>())
        .filter(|name| name.starts_with("TXGATE_"))
        .collect();
    assert_eq!(listed, read_by_settings, "docs/operating.md's configuration table against the settings");
}

/// The wall-clock sleeps of the integration tests, file by file, are the
/// ones docs/development.md lists with their reasons.
#[test]
fn the_sleeps_left_in_the_tests_are_listed_with_their_reasons() {
    let doc = read(&root().join("docs/development.md"));
    let mut listed = std::collections::BTreeMap::new();
    for marker in ["In-process tests", "Across real processes"] {
        for row in table_after(&doc, marker) {
            let count: usize = row[1].parse().unwrap_or_else(|_| panic!("a count of sleeps: {row:?}"));
            assert!(listed.insert(code(row[0]).to_owned(), count).is_none(), "{} listed twice", row[0]);
        }
    }
    let mut found = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(root().join("tests/it")).unwrap() {
        let path = entry.unwrap().path();
        let text = read(&path);
        // Spelled in two pieces, so that this file does not count itself.
        let count: usize = [concat!("time::", "sleep("), concat!("thread::", "sleep(")]
            .iter()
            .map(|call| text.matches(call).count())
            .sum();
        if count > 0 {
            found.insert(format!("tests/it/{}", path.file_name().unwrap().to_string_lossy()), count);
        }
    }
    assert_eq!(found, listed, "sleeps in tests/it against docs/development.md's lists");
}
