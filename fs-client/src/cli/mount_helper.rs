//! `mount.fuse.tessera`: what `mount -t fuse.tessera SOURCE DIR -o OPTIONS` and an fstab
//! line run. The `tessera` binary acts as the helper when called by that name (a link
//! installed beside `mount.fuse3`'s, in `/sbin`). `mount(8)` calls it as
//! `mount.fuse.tessera SOURCE DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE]`.
//!
//! SOURCE is `META_ADDR:/path` (the metadata server and the directory to mount; several
//! servers as `A,B` or `A+B`, the form `/proc/mounts` shows and fstab lines use),
//! `META_ADDR` (the root), or any word without a colon (the metadata server then comes
//! from the configuration file). OPTIONS are the mount's (`ro`, `noatime`, `noexec`,
//! ...), the helper's own (`config=FILE`, `log_file=FILE`, `foreground`, `nonempty`),
//! options only `mount(8)` reads (`_netdev`, `noauto`, `nofail`, `x-systemd.*`, ...),
//! and any client setting by its configuration name (`key_file=/etc/tessera/a.key`,
//! `readahead_max_bytes=67108864`, `transport_limits.max_msg_bytes=...`). With
//! `remount` among them only the kernel's flags of the mount change (`remount.rs`).

use super::daemon::{self, LogTo};
use crate::ClientConfig;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// The configuration read when `config=` is not given, if it exists.
pub const DEFAULT_CONFIG: &str = "/etc/tessera/client.toml";

/// What `mount(8)` passed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HelperArgs {
    /// SOURCE.
    pub source: String,
    /// DIR.
    pub mountpoint: PathBuf,
    /// Every `-o` list, in order.
    pub options: Vec<String>,
    /// `-f`: do everything but mount (`mount -f`).
    pub fake: bool,
    /// `-s`: ignore options this helper does not know, with a warning (`mount -s`).
    pub sloppy: bool,
}

/// Whether `argv0` names the helper (`mount.fuse.tessera`, as `mount(8)` runs it).
pub fn invoked_as_helper(argv0: &std::ffi::OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == "mount.fuse.tessera")
}

/// Parses the helper's command line (without `argv[0]`).
pub fn parse_args(args: &[String]) -> Result<HelperArgs, String> {
    let mut out = HelperArgs::default();
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(opts) = a.strip_prefix("-o") {
            let opts = if opts.is_empty() {
                it.next().cloned()
            } else {
                Some(opts.to_string())
            };
            let Some(opts) = opts else {
                return Err("-o needs a list of options".into());
            };
            out.options.push(opts);
        } else if a == "-t" || a == "-N" {
            // The type is ours by definition; a mount namespace is not supported.
            let Some(v) = it.next() else {
                return Err(format!("{a} needs a value"));
            };
            if a == "-N" {
                return Err(format!(
                    "mounting in another namespace (-N {v}) is not supported"
                ));
            }
        } else if let Some(flags) = a.strip_prefix('-').filter(|f| !f.is_empty()) {
            for f in flags.chars() {
                match f {
                    'f' => out.fake = true,
                    's' => out.sloppy = true,
                    // No mtab, verbose: nothing to do differently.
                    'n' | 'v' => {}
                    _ => return Err(format!("unknown flag -{f}")),
                }
            }
        } else {
            positional.push(a.clone());
        }
    }
    let [source, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|p| format!("expected SOURCE and DIR, got {} arguments", p.len()))?;
    out.source = source;
    out.mountpoint = PathBuf::from(mountpoint);
    Ok(out)
}

/// The options sorted by who reads them.
#[derive(Debug, Default, PartialEq)]
pub struct SortedOptions {
    /// For [`ClientConfig::apply_mount_options`].
    pub mount: Vec<String>,
    /// Client settings by name, with their values as given (`true` for a bare name).
    pub settings: Vec<(String, String)>,
    /// `config=`.
    pub config: Option<PathBuf>,
    /// `log_file=`.
    pub log_file: Option<PathBuf>,
    /// `foreground`: do not fork (to watch a mount's log on the terminal).
    pub foreground: bool,
    /// `nonempty`: mount over a directory that holds files.
    pub nonempty: bool,
}

/// The mount options `ClientConfig::apply_mount_options` takes.
pub const MOUNT_OPTIONS: &[&str] = &[
    "noatime",
    "relatime",
    "strictatime",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "ro",
    "rw",
    "exec",
    "noexec",
    "defaults",
    "async",
];

/// Options (by name, without `=value`) that only `mount(8)` or systemd read, that name
/// what a Tessera mount always does (`default_permissions`), or that change nothing on
/// it (directory atimes follow the mount's atime option; `lazytime` has no page cache
/// times to defer).
fn for_others(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "_netdev",
        "auto",
        "noauto",
        "nofail",
        "user",
        "users",
        "nouser",
        "owner",
        "group",
        "loud",
        "silent",
        "comment",
        "default_permissions",
        "diratime",
        "nodiratime",
        "lazytime",
        "nolazytime",
    ];
    NAMES.contains(&name) || name.starts_with("x-")
}

/// Each option of the comma-separated lists `lists`, in order.
pub(super) fn each_option(lists: &[String]) -> impl Iterator<Item = &str> {
    lists
        .iter()
        .flat_map(|l| l.split(','))
        .filter(|o| !o.is_empty())
}

/// Sorts the comma-separated lists `lists`.
pub fn sort_options(lists: &[String]) -> SortedOptions {
    let mut s = SortedOptions::default();
    for o in each_option(lists) {
        let (name, value) = match o.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (o, None),
        };
        match (name, value) {
            (n, None) if MOUNT_OPTIONS.contains(&n) => s.mount.push(n.to_string()),
            (n, _) if for_others(n) => {}
            ("config", Some(v)) => s.config = Some(PathBuf::from(v)),
            ("log_file", Some(v)) => s.log_file = Some(PathBuf::from(v)),
            ("foreground", None) => s.foreground = true,
            ("nonempty", None) => s.nonempty = true,
            ("noacl", None) => s.settings.push(("acl".into(), "false".into())),
            (n, v) => s
                .settings
                .push((n.to_string(), v.unwrap_or("true").to_string())),
        }
    }
    s
}

/// The default value of the client setting named `name` (dotted into tables:
/// `transport_limits.max_msg_bytes`), if there is such a setting.
fn default_of(defaults: &toml::Table, name: &str) -> Option<toml::Value> {
    let mut at = defaults;
    let mut parts = name.split('.').peekable();
    while let Some(part) = parts.next() {
        let v = at.get(part)?;
        if parts.peek().is_none() {
            return Some(v.clone());
        }
        at = v.as_table()?;
    }
    None
}

/// `value` read as the type of the setting's default (a string stays a string even
/// when it looks like a number: `client_name=1234`).
fn typed(name: &str, value: &str, default: &toml::Value) -> anyhow::Result<toml::Value> {
    use toml::Value as V;
    let bad = |what: &str| anyhow::anyhow!("setting {name}={value}: not {what}");
    Ok(match default {
        V::String(_) => V::String(value.to_string()),
        V::Integer(_) => V::Integer(value.parse().map_err(|_| bad("an integer"))?),
        V::Boolean(_) => V::Boolean(value.parse().map_err(|_| bad("true or false"))?),
        V::Float(_) => V::Float(value.parse().map_err(|_| bad("a number"))?),
        _ => bail!("setting {name}: a table of settings, set its fields by name"),
    })
}

/// The configuration text `base` with `settings` set over it. A name that is no client
/// setting fails, or with `sloppy` is left out with a warning.
pub fn config_with(
    base: &str,
    settings: &[(String, String)],
    sloppy: bool,
) -> anyhow::Result<ClientConfig> {
    let mut table: toml::Table = toml::from_str(base).context("parsing the configuration")?;
    let defaults =
        toml::Table::try_from(ClientConfig::default()).context("the client settings' defaults")?;
    for (name, value) in settings {
        let Some(default) = default_of(&defaults, name) else {
            if sloppy {
                eprintln!("tessera: ignoring mount option {name} (-s)");
                continue;
            }
            bail!("unknown mount option or client setting {name:?}");
        };
        let value = typed(name, value, &default)?;
        let mut at = &mut table;
        let mut parts = name.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                at.insert(part.to_string(), value);
                break;
            }
            let entry = at
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(t) = entry.as_table_mut() else {
                bail!("setting {name}: {part} is not a table of settings");
            };
            at = t;
        }
    }
    table.try_into().context("the client settings")
}

/// Splits SOURCE into the metadata address (if it names one) and the directory.
pub fn split_source(source: &str) -> (Option<&str>, &str) {
    match source.find(":/") {
        Some(i) => (Some(&source[..i]), &source[i + 1..]),
        None if source.contains(':') => (Some(source), "/"),
        None => (None, "/"),
    }
}

/// The client's `meta_addr` list for the addresses of SOURCE, given as `A,B` or as
/// `A+B`: `/proc/mounts` shows the second form (see [`fsname_of`]), and `mount -a`
/// takes an fstab line as mounted only when its source is written the same way.
fn meta_addrs_of(addrs: &str) -> String {
    addrs.replace('+', ",")
}

/// The name the mount shows for SOURCE: an option string is cut at commas, so a
/// source of several metadata addresses (`META1,META2:/path`) is shown with `+`
/// between them.
fn fsname_of(source: &str) -> String {
    source.replace(',', "+")
}

/// The client configuration for `args`, and the sorted options.
pub fn plan(args: &HelperArgs) -> anyhow::Result<(ClientConfig, SortedOptions)> {
    let opts = sort_options(&args.options);
    let path = opts.config.clone().or_else(|| {
        let default = PathBuf::from(DEFAULT_CONFIG);
        default.exists().then_some(default)
    });
    let base = match &path {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading {p:?}"))?,
        None => String::new(),
    };
    let mut c = config_with(&base, &opts.settings, args.sloppy)?;
    let (meta, subdir) = split_source(&args.source);
    if let Some(m) = meta {
        c.meta_addr = meta_addrs_of(m);
        // `META:/` mounts the root whatever the configuration's `subdir` says: the
        // source is what `/proc/mounts` shows.
        c.subdir = subdir.to_string();
    }
    if !c.key_file.as_os_str().is_empty() {
        c.key_file = std::path::absolute(&c.key_file)
            .with_context(|| format!("key_file {}", c.key_file.display()))?;
    }
    c.fsname = fsname_of(&args.source);
    c.apply_mount_options(&opts.mount.join(","))
        .map_err(anyhow::Error::msg)?;
    c.validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    Ok((c, opts))
}

/// `mount(8)`'s exit code for a command line it cannot use.
pub const EXIT_USAGE: i32 = 1;
/// `mount(8)`'s exit code for a mount that failed.
pub const EXIT_MOUNT_FAILED: i32 = 32;

/// Runs the helper on `args` (without `argv[0]`); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tessera: {e}");
            return EXIT_USAGE;
        }
    };
    match run_checked(args) {
        Ok(()) => 0,
        Err(e) => {
            let causes = e.chain().map(|c| c.to_string());
            eprintln!("tessera: {}", telemetry::errors::each_cause_once(causes));
            EXIT_MOUNT_FAILED
        }
    }
}

fn run_checked(mut args: HelperArgs) -> anyhow::Result<()> {
    // The mount process works from `/` once it is in the background.
    args.mountpoint = std::path::absolute(&args.mountpoint)
        .with_context(|| format!("mount point {}", args.mountpoint.display()))?;
    if super::remount::is_remount(&args.options) {
        // The mount and its process are there already: only the kernel's flags change.
        if args.fake {
            return Ok(());
        }
        return super::remount::remount(&args.mountpoint, &args.options);
    }
    let (mut config, opts) = plan(&args)?;
    super::local_cluster::check_mountpoint(&args.mountpoint, opts.nonempty)?;
    config.transport = config
        .transport
        .resolve_for_process(&config.transport_limits)?;
    if args.fake {
        return Ok(());
    }
    if opts.foreground {
        super::init_logging();
        return super::commands::mount(args.mountpoint, config, || {});
    }
    let log = match (opts.log_file, daemon::stderr_is_the_journal()) {
        (Some(f), _) => LogTo::File(f),
        (None, true) => LogTo::Journal,
        (None, false) => LogTo::File(daemon::default_log(&args.mountpoint)),
    };
    let mut ready = daemon::daemonize(&log).context("starting the mount process")?;
    super::init_logging();
    let result = super::commands::mount(args.mountpoint, config, || ready.mounted());
    if let Err(e) = &result {
        let causes = e.chain().map(|c| c.to_string());
        ready.failed(&telemetry::errors::each_cause_once(causes));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_command_line_mount_passes_is_parsed() {
        let a = parse_args(&strings(&[
            "10.0.0.1:7600:/data",
            "/mnt/x",
            "-sv",
            "-o",
            "rw,noatime",
            "-oro",
            "-t",
            "fuse.tessera",
        ]))
        .unwrap();
        assert_eq!(a.source, "10.0.0.1:7600:/data");
        assert_eq!(a.mountpoint, Path::new("/mnt/x"));
        assert_eq!(a.options, ["rw,noatime", "ro"]);
        assert!(!a.fake && a.sloppy);
        assert!(parse_args(&strings(&["a", "/m", "-f"])).unwrap().fake);
        assert!(parse_args(&strings(&["a"])).is_err());
        assert!(parse_args(&strings(&["a", "/m", "-o"])).is_err());
        assert!(parse_args(&strings(&["a", "/m", "-N", "x"])).is_err());
        assert!(parse_args(&strings(&["a", "/m", "-q"])).is_err());
    }

    #[test]
    fn options_are_sorted_by_who_reads_them() {
        let s = sort_options(&strings(&[
            "_netdev,noauto,x-systemd.automount,user=alice,nodiratime,comment=x",
            "ro,noatime,config=/etc/t.toml",
            "allow_other,readahead_max_bytes=1024,log_file=/tmp/l,foreground,nonempty,noacl",
        ]));
        assert_eq!(s.mount, ["ro", "noatime"]);
        assert_eq!(s.config, Some(PathBuf::from("/etc/t.toml")));
        assert_eq!(s.log_file, Some(PathBuf::from("/tmp/l")));
        assert!(s.foreground && s.nonempty);
        assert_eq!(
            s.settings,
            [
                ("allow_other".to_string(), "true".to_string()),
                ("readahead_max_bytes".to_string(), "1024".to_string()),
                ("acl".to_string(), "false".to_string())
            ]
        );
    }

    #[test]
    fn settings_by_name_override_the_file_and_unknown_ones_are_refused() {
        let base = "attr_ttl_ms = 5\n[transport_limits]\nmax_msg_bytes = 65536\n";
        let set = |n: &str, v: &str| (n.to_string(), v.to_string());
        let c = config_with(
            base,
            &[
                set("attr_ttl_ms", "7"),
                set("writeback_cache", "true"),
                set("key_file", "/etc/tessera/a.key"),
                set("client_name", "1234"),
                set("transport_limits.max_msg_bytes", "131072"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(c.attr_ttl_ms, 7);
        assert!(c.writeback_cache);
        assert_eq!(c.key_file, Path::new("/etc/tessera/a.key"));
        assert_eq!(c.client_name, "1234", "a string that looks like a number");
        assert_eq!(c.transport_limits.max_msg_bytes, 131072);
        let e = config_with("", &[set("sync", "true")], false).unwrap_err();
        assert!(format!("{e:#}").contains("sync"), "{e:#}");
        assert!(config_with("", &[set("sync", "true")], true).is_ok(), "-s");
        let e = config_with("", &[set("attr_ttl_ms", "soon")], false).unwrap_err();
        assert!(format!("{e:#}").contains("integer"), "{e:#}");
        assert!(config_with("", &[set("attr_ttl_ms.x", "1")], false).is_err());
        assert!(config_with("", &[set("transport_limits", "1")], false).is_err());
    }

    #[test]
    fn the_source_names_the_server_and_the_directory() {
        assert_eq!(split_source("h:7600:/a/b"), (Some("h:7600"), "/a/b"));
        assert_eq!(split_source("[::1]:7600:/"), (Some("[::1]:7600"), "/"));
        assert_eq!(split_source("h:7600"), (Some("h:7600"), "/"));
        assert_eq!(split_source("tessera"), (None, "/"));
        // A server and its standby: the list is the client's `meta_addr`.
        assert_eq!(split_source("a:1,b:2:/x"), (Some("a:1,b:2"), "/x"));
        assert_eq!(fsname_of("a:1,b:2:/x"), "a:1+b:2:/x");
        // The form /proc/mounts shows names the same list (fstab lines use it).
        assert_eq!(split_source("a:1+b:2:/x"), (Some("a:1+b:2"), "/x"));
        assert_eq!(meta_addrs_of("a:1+b:2"), "a:1,b:2");
        assert_eq!(meta_addrs_of("a:1,[::1]:2"), "a:1,[::1]:2");
        assert_eq!(fsname_of("a:1+b:2:/x"), "a:1+b:2:/x");
    }

    #[test]
    fn only_the_helper_name_selects_the_helper() {
        assert!(invoked_as_helper("/sbin/mount.fuse.tessera".as_ref()));
        assert!(!invoked_as_helper("/usr/bin/tessera".as_ref()));
    }
}
