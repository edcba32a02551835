//! What `redlock` generates from its own command line: the completion script of each shell
//! (`redlock completions SHELL`) and the man pages (`redlock man [SUBCOMMAND]`), on stdout.

use crate::common::{code, everything, redlock, stdout};

/// Every subcommand an operator runs (`help` aside).
const SUBCOMMANDS: [&str; 6] = ["inspect", "key", "unlock", "watch", "completions", "man"];

#[tokio::test]
async fn completions_cli_every_shell_gets_a_script_naming_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = redlock(&["completions", shell]).await;
        assert_eq!(code(&out), 0, "{shell}: {}", everything(&out));
        assert!(out.stderr.is_empty(), "{shell}: {}", everything(&out));
        let script = stdout(&out);
        assert!(script.contains("redlock"), "{shell}: {script}");
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: no {sub} in {script}");
        }
        // The flags too, down to a subcommand's own (fish writes them `-l any-holder`).
        assert!(script.contains("any-holder"), "{shell}: {script}");
        assert!(script.contains("verbose"), "{shell}: {script}");
    }
    let out = redlock(&["completions", "tcsh"]).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(out.stdout.is_empty(), "{}", everything(&out));
}

/// The page's first request after the apostrophe preamble every clap_mangen page opens
/// with (`.ie`/`.el`, defining `\*(Aq`).
fn title(page: &str) -> &str {
    page.lines()
        .find(|l| !l.starts_with(".ie ") && !l.starts_with(".el "))
        .unwrap_or("")
}

#[tokio::test]
async fn man_cli_pages_are_roff_and_name_every_subcommand_and_flag() {
    let out = redlock(&["man"]).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let page = stdout(&out);
    assert!(title(&page).starts_with(".TH redlock 1 "), "{page}");
    for section in [
        "NAME",
        "SYNOPSIS",
        "OPTIONS",
        "SUBCOMMANDS",
        "\"EXIT STATUS\"",
        "ENVIRONMENT",
    ] {
        assert!(
            page.contains(&format!("\n.SH {section}\n")),
            "no {section}: {page}"
        );
    }
    for sub in SUBCOMMANDS {
        assert!(
            page.contains(&format!("redlock\\-{sub}(1)")),
            "no {sub}: {page}"
        );
    }
    assert!(
        page.contains("\\-\\-verbose") && page.contains("RUST_LOG"),
        "{page}"
    );
    // Every line is text or a request roff knows (no stray markup from the help texts).
    for line in page.lines().filter(|l| l.starts_with('.')) {
        let request = line[1..].split_whitespace().next().unwrap_or("");
        assert!(
            [
                "ie", "el", "TH", "SH", "SS", "TP", "PP", "IP", "RS", "RE", "B", "I", "br", "sp",
                "nf", "fi"
            ]
            .contains(&request),
            "unknown request {line:?}"
        );
    }

    for sub in SUBCOMMANDS {
        let out = redlock(&["man", sub]).await;
        assert_eq!(code(&out), 0, "{sub}: {}", everything(&out));
        let page = stdout(&out);
        let th = format!(".TH redlock-{sub} 1 ");
        assert!(title(&page).starts_with(&th), "{sub}: {page}");
        // The global flags are among each page's options.
        assert!(page.contains("\\-\\-url"), "{sub}: {page}");
    }
    let unlock = stdout(&redlock(&["man", "unlock"]).await);
    for flag in [
        "\\-\\-force",
        "\\-\\-holder",
        "\\-\\-any\\-holder",
        "\\-\\-yes",
    ] {
        assert!(unlock.contains(flag), "no {flag}: {unlock}");
    }

    let out = redlock(&["man", "nope"]).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(
        everything(&out).contains("expected one of inspect"),
        "{}",
        everything(&out)
    );
}
