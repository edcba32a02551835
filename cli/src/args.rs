//! The command line as clap parses it: the global flags, and one struct per subcommand.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The exit codes, shown at the end of `--help` (and, a line per code, in the man page's
/// EXIT STATUS).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done (for inspect: whatever the lock's state)
  1  a voter did not answer (unlock), or a lock error
  2  usage error or bad input: a bad flag, URL, resource or request key; a refused unlock
  3  (key) the request passes through unlocked";

/// redlock: see, clear and watch the locks of tower-redlock on N Redis masters, and compute
/// the Redis key the middleware locks for a request.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// The flags every subcommand takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The flags every subcommand takes.
#[derive(Debug, Args)]
pub struct Global {
    /// A voter's URL (repeat for each voter): redis://, rediss://, redis+sentinel://… A
    /// comma-separated list is split the library's way: a Sentinel's or a Cluster's hosts stay
    /// together. Never printed: voters are shown as host:port.
    #[arg(
        long = "url",
        value_name = "URL",
        env = "REDLOCK_URLS",
        hide_env_values = true,
        global = true
    )]
    pub urls: Vec<String>,

    /// Machine output: JSON on stdout (one line per refresh for watch).
    #[arg(long, global = true)]
    pub json: bool,

    /// The per-voter timeout in milliseconds (default: the library's, 50 ms).
    #[arg(long, value_name = "MS", global = true)]
    pub timeout: Option<u64>,

    /// The Redlock client's key prefix, as the application configures it
    /// (`RedlockBuilder::key_prefix`); by default none: a resource is exactly the Redis key.
    #[arg(long, value_name = "PREFIX", global = true)]
    pub key_prefix: Option<String>,

    /// More of the library's log on stderr: its warnings are always shown, -v adds info,
    /// -vv debug, -vvv trace. RUST_LOG, when set, replaces this filter (e.g. RUST_LOG=off).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Who holds a resource on which voter: holder, ttl, fencing counter, completion record.
    /// Reads only; exits 0 whatever the lock's state.
    Inspect(InspectArgs),
    /// The Redis key the middleware locks for a request (no Redis needed).
    #[command(long_about = crate::key::LONG_ABOUT)]
    Key(KeyArgs),
    /// Delete the lock of a holder named by its token prefix (needs --force: it breaks
    /// mutual exclusion if the holder is alive).
    Unlock(UnlockArgs),
    /// A live table of the locks held under a prefix on every voter.
    Watch(WatchArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions(CompletionsArgs),
    /// Print the man page (roff) of redlock, or of one subcommand, to stdout.
    Man(ManArgs),
}

/// `redlock inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The resource (the Redis key, without the client's --key-prefix).
    pub resource: String,
    /// The completion records' retention (the replay policy's), to tell a record's age:
    /// e.g. 24h, 90m, 30s, 500ms.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub retention: Duration,
}

/// `redlock key`: the request's parts, the key source, its scopings and the policy's settings.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The request's method.
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// The request's path (with its query, if any).
    #[arg(long)]
    pub path: String,
    /// The route template the router matched, e.g. /payments/{id} (default: the path, as
    /// for a router that exposes none).
    #[arg(long)]
    pub route: Option<String>,
    /// A request header, NAME:VALUE (repeatable), e.g. 'idempotency-key: "k-1"'.
    #[arg(long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// A route parameter, NAME=VALUE (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// Where the key comes from: idempotency-key, header:NAME, path, method-path,
    /// route-param:NAME, grpc-method.
    #[arg(long, default_value = "idempotency-key", value_parser = parse_source)]
    pub source: Source,
    /// The key source is optional (`IdempotencyKey::optional`, `HeaderKey::optional`): a
    /// request without it passes through unlocked instead of being rejected.
    #[arg(long)]
    pub optional: bool,
    /// A scoping, in the order the application applies them (repeatable): route, method,
    /// header:NAME, grpc-method, extension:VALUE (VALUE: what the app's scoped_by_extension
    /// closure returns for this request, e.g. the tenant id).
    #[arg(long = "scope", value_name = "SCOPE", value_parser = parse_scope)]
    pub scopes: Vec<Scope>,
    /// The extractor's key prefix (`KeyExtractorExt::prefix`; default the library's
    /// `tower-redlock:`).
    #[arg(long)]
    pub prefix: Option<String>,
    /// The environment variable holding the policy's hmac_key secret (never given as a flag
    /// value, so it stays out of shell history and process lists).
    #[arg(long, value_name = "VAR")]
    pub hmac_key_env: Option<String>,
    /// The methods the policy locks, comma-separated, or `any` (default: POST,PUT,PATCH,DELETE).
    #[arg(long, value_name = "METHODS", value_delimiter = ',')]
    pub methods: Vec<String>,
}

/// Where `redlock key` reads the key from: one of the library's extractors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `IdempotencyKey`.
    IdempotencyKey,
    /// `HeaderKey::new(name)`.
    Header(String),
    /// `PathKey`.
    Path,
    /// `MethodPathKey`.
    MethodPath,
    /// `RouteParamKey::new(name)`.
    RouteParam(String),
    /// `GrpcMethodKey`.
    GrpcMethod,
}

/// One scoping of `redlock key`: one `KeyExtractorExt::scoped_by_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `scoped_by_route`.
    Route,
    /// `scoped_by_method`.
    Method,
    /// `scoped_by_header(name)`.
    Header(String),
    /// `scoped_by_grpc_method`.
    GrpcMethod,
    /// `scoped_by_extension`, with the value its closure returns.
    Extension(String),
}

/// `redlock unlock`.
#[derive(Debug, Args)]
pub struct UnlockArgs {
    /// The resource (the Redis key, without the client's --key-prefix).
    pub resource: String,
    /// Required: delete the lock. If its holder is alive, the next request takes the lock
    /// while the old holder still works.
    #[arg(long)]
    pub force: bool,
    /// The holder to clear: its token prefix as `redlock inspect` shows it (8 to 32 hex
    /// digits). A re-run deletes nothing of a holder that took the key meanwhile, and
    /// `--record` deletes the record only where this holder's lock was deleted.
    #[arg(long, value_name = "PREFIX", conflicts_with = "any_holder")]
    pub holder: Option<String>,
    /// Instead of --holder: clear whatever holds the key, also a holder that took it a moment
    /// ago. Only with a confirmation typed on a terminal (--yes does not do).
    #[arg(long)]
    pub any_holder: bool,
    /// Delete the completion record too: the next request with this key runs again instead
    /// of being replayed.
    #[arg(long)]
    pub record: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal). With --any-holder
    /// the question is asked all the same.
    #[arg(long)]
    pub yes: bool,
    /// Who asks: printed with the result and given to the library, which logs it at warn
    /// (default: $USER, else redlock-cli).
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

/// `redlock watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The Redis key prefix to list (the client's --key-prefix is not added).
    #[arg(long)]
    pub prefix: String,
    /// The time between refreshes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub interval_ms: u64,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// At most this many locks per voter.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
}

/// `redlock completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `redlock man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The subcommand whose page to print, as redlock-SUBCOMMAND(1) (default: redlock(1)).
    pub subcommand: Option<String>,
}

/// `24h`, `90m`, `30s`, `500ms`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 24h, 90m, 30s, 500ms)"))?;
    let secs = |k: u64| n.checked_mul(k).map(Duration::from_secs);
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => None,
    }
    .ok_or_else(|| format!("{s:?} is not a duration (e.g. 24h, 90m, 30s, 500ms)"))
}

/// `NAME:VALUE`; the value's leading spaces are dropped, as HTTP does.
fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not NAME:VALUE"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{s:?} has no header name"));
    }
    Ok((name.to_owned(), value.trim_start().to_owned()))
}

/// `NAME=VALUE`.
fn parse_param(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    Ok((name.to_owned(), value.to_owned()))
}

/// A word, or `word:ARG` when the word takes one.
fn named(s: &str, word: &str) -> Option<Result<String, String>> {
    let arg = s.strip_prefix(word)?.strip_prefix(':')?;
    Some(if arg.is_empty() {
        Err(format!("{word}: needs a name after the colon"))
    } else {
        Ok(arg.to_owned())
    })
}

fn parse_source(s: &str) -> Result<Source, String> {
    Ok(match s {
        "idempotency-key" => Source::IdempotencyKey,
        "path" => Source::Path,
        "method-path" => Source::MethodPath,
        "grpc-method" => Source::GrpcMethod,
        _ => {
            if let Some(name) = named(s, "header") {
                Source::Header(name?)
            } else if let Some(name) = named(s, "route-param") {
                Source::RouteParam(name?)
            } else {
                return Err(format!(
                    "{s:?}: expected idempotency-key, header:NAME, path, method-path, \
                     route-param:NAME or grpc-method"
                ));
            }
        }
    })
}

fn parse_scope(s: &str) -> Result<Scope, String> {
    Ok(match s {
        "route" => Scope::Route,
        "method" => Scope::Method,
        "grpc-method" => Scope::GrpcMethod,
        _ => {
            if let Some(name) = named(s, "header") {
                Scope::Header(name?)
            } else if let Some(value) = named(s, "extension") {
                Scope::Extension(value?)
            } else {
                return Err(format!(
                    "{s:?}: expected route, method, header:NAME, grpc-method or extension:VALUE"
                ));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_retention_durations_and_key_request_parts_parse() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("h").is_err() && parse_duration("3w").is_err());
        assert_eq!(
            parse_header("Idempotency-Key: \"k:1\""),
            Ok(("Idempotency-Key".into(), "\"k:1\"".into()))
        );
        assert_eq!(parse_param("id=7"), Ok(("id".into(), "7".into())));
        assert_eq!(
            parse_source("header:x-req"),
            Ok(Source::Header("x-req".into()))
        );
        assert!(parse_source("header:").is_err() && parse_source("body").is_err());
        assert_eq!(
            parse_scope("extension:acme"),
            Ok(Scope::Extension("acme".into()))
        );
    }

    #[test]
    fn key_inspect_force_unlock_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
