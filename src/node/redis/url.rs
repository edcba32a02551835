//! Voter URLs beyond redis-rs' own: `redis+sentinel://` and `redis+cluster://` (and their
//! `rediss+` TLS forms), and splitting a comma-separated list of voters.

use super::sentinel::Sentinel;

/// What a URL names.
pub(super) enum Voter {
    /// A plain `redis://`, `rediss://` (or `unix://`) master: redis-rs parses it.
    Master,
    Sentinel(Box<Sentinel>),
    #[cfg(feature = "cluster")]
    Cluster(super::Cluster),
}

/// Splits a comma-separated list of voter URLs, keeping a Sentinel's or a Cluster's hosts
/// together: a piece without `://` continues the URL before it.
///
/// ```
/// use tower_redlock::node::split_urls;
///
/// let urls = split_urls(
///     "redis+sentinel://10.0.1.1:26379,10.0.1.2:26379,10.0.1.3:26379/payments, \
///      redis+cluster://10.0.2.1:7000,10.0.2.2:7000, redis://10.0.3.1:6379",
/// );
/// assert_eq!(
///     urls,
///     [
///         "redis+sentinel://10.0.1.1:26379,10.0.1.2:26379,10.0.1.3:26379/payments",
///         "redis+cluster://10.0.2.1:7000,10.0.2.2:7000",
///         "redis://10.0.3.1:6379",
///     ]
/// );
/// ```
pub fn split_urls(list: &str) -> Vec<&str> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut pos = 0;
    for piece in list.split(',') {
        let (start, end) = (pos, pos + piece.len());
        pos = end + 1;
        if piece.trim().is_empty() {
            continue;
        }
        match spans.last_mut() {
            Some(last) if !piece.contains("://") => last.1 = end,
            _ => spans.push((start, end)),
        }
    }
    spans.into_iter().map(|(a, b)| list[a..b].trim()).collect()
}

/// A URL's `protection` parameter: `Some(Some(max_ttl))` for `protection=<ms>`,
/// `Some(None)` for `protection=off`, `None` when absent (the voter kind's default).
pub(super) type Protection = Option<Option<std::time::Duration>>;

pub(super) fn parse(url: &str) -> crate::Result<(Voter, Protection)> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((Voter::Master, None));
    };
    let (tls, kind) = match scheme {
        "redis+sentinel" => (false, "sentinel"),
        "rediss+sentinel" => (true, "sentinel"),
        "redis+cluster" => (false, "cluster"),
        "rediss+cluster" => (true, "cluster"),
        _ => return Ok((Voter::Master, None)),
    };
    let bad = Bad { kind, url };
    let mut parts = Parts::of(rest, tls, &bad)?;
    let protection = protection(&mut parts.params, &bad)?;
    let voter = match kind {
        "cluster" => cluster(parts, &bad)?,
        _ => sentinel(parts, &bad)?,
    };
    Ok((voter, protection))
}

/// The invalid-input error of one URL, which it shows redacted.
struct Bad<'a> {
    kind: &'static str,
    url: &'a str,
}

impl Bad<'_> {
    fn because(&self, why: &str) -> crate::Error {
        let (kind, url) = (self.kind, redact(self.url));
        crate::Error::invalid(format!("invalid {kind} URL `{url}`: {why}"))
    }
}

/// A Sentinel or Cluster URL after its scheme, taken apart.
struct Parts<'a> {
    tls: bool,
    /// After the hosts' `/`: `master-name[/db]` for a Sentinel group.
    path: &'a str,
    /// (username, password) from the userinfo.
    auth: Option<(Option<String>, String)>,
    hosts: Vec<&'a str>,
    /// The query's parameters, in order.
    params: Vec<(String, String)>,
}

impl<'a> Parts<'a> {
    fn of(rest: &'a str, tls: bool, bad: &Bad<'_>) -> crate::Result<Self> {
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let auth = userinfo.map(credentials).transpose();
        let params = query.map(parse_query).transpose();
        Ok(Self {
            tls,
            path,
            auth: auth.map_err(|e| bad.because(&e))?,
            hosts: hosts.split(',').map(str::trim).collect(),
            params: params.map_err(|e| bad.because(&e))?.unwrap_or_default(),
        })
    }
}

/// The `protection` parameter, taken out of `params`.
fn protection(params: &mut Vec<(String, String)>, bad: &Bad<'_>) -> crate::Result<Protection> {
    let Some(i) = params.iter().position(|(k, _)| k == "protection") else {
        return Ok(None);
    };
    let (_, v) = params.remove(i);
    if v == "off" {
        return Ok(Some(None));
    }
    let ms = v.parse::<u64>().ok().filter(|&ms| ms > 0);
    let ms = ms.ok_or_else(|| bad.because("`protection` is a ttl in milliseconds, or `off`"))?;
    Ok(Some(Some(std::time::Duration::from_millis(ms))))
}

/// A `redis+cluster://` voter.
fn cluster(parts: Parts<'_>, bad: &Bad<'_>) -> crate::Result<Voter> {
    if !parts.path.is_empty() {
        return Err(bad.because("a cluster URL has no path (a cluster has one database)"));
    }
    if let Some((k, _)) = parts.params.first() {
        return Err(bad.because(&format!("unknown parameter `{k}`")));
    }
    #[cfg(feature = "cluster")]
    {
        let mut cluster = super::Cluster::new(parts.hosts)?;
        if let Some((user, pass)) = &parts.auth {
            cluster = cluster.password(user.as_deref(), pass);
        }
        if parts.tls {
            cluster = cluster.tls();
        }
        Ok(Voter::Cluster(cluster))
    }
    #[cfg(not(feature = "cluster"))]
    {
        Err(bad.because("Cluster voters need the `cluster` feature of tower-redlock"))
    }
}

/// A `redis+sentinel://…/master-name[/db]` voter.
fn sentinel(parts: Parts<'_>, bad: &Bad<'_>) -> crate::Result<Voter> {
    let mut path = parts.path.split('/');
    let master = path.next().unwrap_or_default();
    let db = match path.next() {
        None | Some("") => None,
        Some(db) => Some(
            db.parse::<i64>()
                .map_err(|_| bad.because("the database must be a number"))?,
        ),
    };
    if path.next().is_some_and(|p| !p.is_empty()) {
        return Err(bad.because("expected `/master-name[/db]` after the sentinels"));
    }
    if master.is_empty() {
        return Err(bad.because("the master's name is missing (`…/master-name`)"));
    }
    let mut group = Sentinel::new(master, &parts.hosts)?;
    if let Some((user, pass)) = &parts.auth {
        group = group.master_password(user.as_deref(), pass);
    }
    if let Some(db) = db {
        group = group.master_db(db);
    }
    let (mut s_user, mut s_pass) = (None, None);
    for (k, v) in parts.params {
        match k.as_str() {
            "sentinel_username" => s_user = Some(v),
            "sentinel_password" => s_pass = Some(v),
            other => return Err(bad.because(&format!("unknown parameter `{other}`"))),
        }
    }
    match (s_user, s_pass) {
        (user, Some(pass)) => group = group.sentinel_password(user.as_deref(), &pass),
        (Some(_), None) => {
            return Err(bad.because("`sentinel_username` without `sentinel_password`"))
        }
        (None, None) => {}
    }
    if parts.tls {
        group = group.tls();
    }
    Ok(Voter::Sentinel(Box::new(group)))
}

/// `user:password`, `:password` or `password`, percent-decoded: (username, password).
fn credentials(userinfo: &str) -> Result<(Option<String>, String), String> {
    let (user, pass) = match userinfo.split_once(':') {
        Some((u, p)) => (u, p),
        None => ("", userinfo),
    };
    let user = decode(user)?;
    Ok(((!user.is_empty()).then_some(user), decode(pass)?))
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// Percent-decoding (`%41` → `A`) of a URL part.
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a `%` not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoded bytes that are not UTF-8".to_owned())
}

/// The URL without credentials (before `@`) or query (it may hold a sentinel password).
fn redact(url: &str) -> String {
    let url = url.split('?').next().unwrap_or(url);
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(url: &str) -> Sentinel {
        match parse(url) {
            Ok((Voter::Sentinel(s), _)) => *s,
            Ok(_) => panic!("{url}: not a sentinel voter"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn splits_lists_of_voters() {
        assert_eq!(
            split_urls("redis://a:1,redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
        assert_eq!(split_urls(" redis://a:1 , "), ["redis://a:1"]);
        assert_eq!(
            split_urls("redis+cluster://a:1,b:2,redis+sentinel://c:3,d:4/m/2,redis://e:5"),
            [
                "redis+cluster://a:1,b:2",
                "redis+sentinel://c:3,d:4/m/2",
                "redis://e:5"
            ]
        );
        assert!(split_urls("").is_empty());
    }

    #[test]
    fn parses_sentinel_urls() {
        let s = format!(
            "{:?}",
            sentinel(
                "redis+sentinel://u:p%40ss@a:26379,[::1]:26380,b/mymaster/3?sentinel_password=x"
            )
        );
        assert!(
            s.contains("mymaster") && s.contains("26380") && !s.contains("p@ss"),
            "{s}"
        );
        assert!(matches!(parse("redis://a:1"), Ok((Voter::Master, None))));
        assert!(matches!(
            parse("unix:///tmp/r.sock"),
            Ok((Voter::Master, None))
        ));
        let ms = std::time::Duration::from_millis;
        assert!(matches!(
            parse("redis+sentinel://a:1/m?protection=off"),
            Ok((_, Some(None)))
        ));
        assert!(
            matches!(parse("redis+sentinel://a:1/m?protection=5000"), Ok((_, Some(Some(d)))) if d == ms(5000))
        );
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel:///m",
            "redis+sentinel://a:x/m",
            "redis+sentinel://a:1/m/db",
            "redis+sentinel://a:1/m/1/2",
            "redis+sentinel://a:1/m?color=red",
            "redis+sentinel://a:1/m?sentinel_username=u",
            "redis+sentinel://%zz@a:1/m",
            "redis+cluster://a:1/0",
            "redis+cluster://a:1?color=red",
            "redis+sentinel://a:1/m?protection=0",
            "redis+sentinel://a:1/m?protection=soon",
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed"));
            assert!(e.is_invalid_input(), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_do_not_show_credentials() {
        let e = parse("redis+sentinel://u:hunter2@a:1/m/x?sentinel_password=swordfish")
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains("hunter2") && !e.contains("swordfish"), "{e}");
    }
}
