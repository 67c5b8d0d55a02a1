//! `docs/flags.md` documents every flag and environment variable the `tensile` binary shows:
//! `tensile <sub> --help` for every subcommand (found in `tensile --help`, recursing into
//! `tensile bench ...`), every `--long-flag` and every `[env: NAME=` in it, each looked up in the
//! section of `docs/flags.md` whose heading names `tensile <sub>`. A flag added to the CLI without
//! a line there fails this test. Hidden flags (`hide = true`) are not in `--help` and are not
//! checked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

const FLAGS_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/flags.md");

/// Flags every clap command has, documented nowhere on purpose.
const BUILT_IN: [&str; 2] = ["help", "version"];

/// `tensile <path> --help`, as text.
fn help(path: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(path)
        .arg("--help")
        .output()
        .expect("running the tensile binary");
    let shown = format!("tensile {}", path.join(" "));
    assert!(
        out.status.success(),
        "`{shown} --help` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("--help prints UTF-8")
}

/// The subcommands listed under `Commands:` (without clap's `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The long flags of the options `help` defines: lines `  -x, --name ...` or `      --name ...`.
fn flags(help: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in help.lines() {
        let line = line.trim_start();
        let line = match line.as_bytes() {
            [b'-', short, b',', b' ', ..] if *short != b'-' => &line[4..],
            _ => line,
        };
        let Some(rest) = line.strip_prefix("--") else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| is_name_char(*c)).collect();
        if !name.is_empty() && !BUILT_IN.contains(&name.as_str()) && !found.contains(&name) {
            found.push(name);
        }
    }
    found
}

/// The environment variables `help` names as `[env: NAME=...]`.
fn env_vars(help: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in help.match_indices("[env: ") {
        let rest = &help[at + "[env: ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| *c != '=' && *c != ']')
            .collect();
        let name = name.trim().to_owned();
        if !name.is_empty() && !found.contains(&name) {
            found.push(name);
        }
    }
    found
}

/// The heading of the section of the flags every subcommand takes (clap's global flags, shown
/// in `tensile --help` and again in each subcommand's).
const COMMON: &str = "Common to every subcommand";

/// The section of `doc` under the `## ` heading that names `` `tensile <path>` `` (for the empty
/// path, the one titled [`COMMON`]), up to the next `## ` heading.
fn section<'a>(doc: &'a str, path: &str) -> Option<&'a str> {
    let title = if path.is_empty() {
        COMMON.to_owned()
    } else {
        format!("`tensile {path}`")
    };
    let mut start = None;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        if line.starts_with("## ") {
            if let Some(s) = start {
                return Some(&doc[s..offset]);
            }
            if line.contains(&title) {
                start = Some(offset);
            }
        }
        offset += line.len();
    }
    start.map(|s| &doc[s..])
}

/// Whether `text` has `word` not followed by another name character (so `--v` is not found in
/// `--vmodule`, nor `KUBELET_PORT` in `KUBELET_PORTS`).
fn mentions(text: &str, word: &str, preceded_ok: fn(Option<char>) -> bool) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        preceded_ok(before) && !after.is_some_and(is_name_char)
    })
}

#[test]
fn every_flag_and_env_var_in_the_help_of_every_subcommand_is_in_docs_flags_md() {
    let doc = std::fs::read_to_string(FLAGS_DOC).expect("reading docs/flags.md");
    let top = help(&[]);
    // Global flags: documented once, in the common section, and not again per subcommand.
    let global = flags(&top);
    let mut pending: Vec<Vec<String>> = vec![Vec::new()];
    pending.extend(subcommands(&top).into_iter().map(|s| vec![s]));
    assert!(
        pending
            .iter()
            .any(|p| p.first().is_some_and(|s| s == "virtual-node"))
            && pending.len() >= 8,
        "could not read the subcommands from `tensile --help`:\n{top}"
    );
    let (mut checked, mut missing) = (0, Vec::new());
    while let Some(path) = pending.pop() {
        let text = help(&path);
        if !path.is_empty() {
            for sub in subcommands(&text) {
                let mut deeper = path.clone();
                deeper.push(sub);
                pending.push(deeper);
            }
        }
        let mut flags = flags(&text);
        if !path.is_empty() {
            flags.retain(|f| !global.contains(f));
        }
        let envs = env_vars(&text);
        if flags.is_empty() && envs.is_empty() {
            continue;
        }
        let name = path.join(" ");
        let Some(body) = section(&doc, &name) else {
            missing.push(format!(
                "no section \"## `tensile {name}`\" (or \"## {COMMON}\") for its flags {flags:?} and variables {envs:?}"
            ));
            continue;
        };
        for flag in flags {
            checked += 1;
            // `--flag` anywhere but as the start of a longer one (`--v` is not in `--vmodule`).
            let word = format!("--{flag}");
            if !mentions(body, &word, |_| true) {
                missing.push(format!("`tensile {name}`: flag {word}"));
            }
        }
        for var in envs {
            checked += 1;
            if !mentions(body, &var, |before| !before.is_some_and(is_name_char)) {
                missing.push(format!("`tensile {name}`: environment variable {var}"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} flags found: is the help parsed?"
    );
    assert!(
        missing.is_empty(),
        "docs/flags.md does not document what `--help` shows (add a row to the subcommand's \
         section):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_help_parsers_read_clap_output() {
    let text = "Usage: tensile bench <COMMAND>\n\nCommands:\n  offload        Pods\n  \
                fragmentation  Three\n  help           Print\n\nOptions:\n  -h, --help  Print \
                help\n      --klog.v <KLOG_V>  klog\n      --CA <CA>\n          Require\n      \
                --nodename <NODENAME>  Name [env: DEFAULTNODE_NAME=] [default: virtual-kubelet]\n";
    assert_eq!(subcommands(text), ["offload", "fragmentation"]);
    assert_eq!(flags(text), ["klog.v", "CA", "nodename"]);
    assert_eq!(env_vars(text), ["DEFAULTNODE_NAME"]);
    let doc = "# t\n## `tensile a`\n`--v`, `--klog.vmodule`\n## `tensile a b`\n`--w`\n";
    let a = section(doc, "a").unwrap();
    assert!(mentions(a, "--v", |_| true));
    assert!(!mentions(a, "--klog.v", |_| true));
    assert!(!mentions(a, "--w", |_| true));
    assert_eq!(section(doc, "a b"), Some("## `tensile a b`\n`--w`\n"));
    assert_eq!(section(doc, "b"), None);
}
