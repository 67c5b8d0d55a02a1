//! What `kubectl exec` runs in a simulated container: a small built-in shell and commands,
//! over a per-container in-memory file system. No host process is ever run.
//!
//! - `sh`/`bash` alone is a session: with a terminal (`exec -it`) it prompts, echoes what is
//!   typed and handles the terminal's line discipline (Enter is CR and output lines end in
//!   CR LF, Backspace erases, Ctrl-C drops the line, Ctrl-D on an empty line ends the
//!   session); without one it runs the lines it reads from stdin.
//! - `sh -c SCRIPT` runs a script: commands separated by `;`, `&&`, `||` or new lines, words
//!   with quotes and `$VAR`/`${VAR}`, `>`/`>>` into a file. No pipes, globs or control flow.
//! - Any other command line is one command, as the container runtime would start it.
//!
//! Files: `/etc/hostname`, `/etc/hosts`, the usual top folders, ConfigMap and Secret volumes
//! (read-only, read from the API at each access), and whatever is written (other volumes, `/tmp`,
//! `kubectl cp`): enough for `tar` as `kubectl cp` uses it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tensile_kubelet::{ExecIo, ExitStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const COMMANDS: &[&str] = &[
    "cat", "cd", "date", "echo", "env", "exit", "false", "hostname", "id", "ls", "mkdir",
    "printenv", "pwd", "rm", "sh", "sleep", "stty", "tar", "test", "[", "touch", "true", "uname",
    "whoami",
];

/// The file systems of a node's containers, by (pod uid, container).
pub(super) type Files = HashMap<(String, String), Arc<Mutex<Fs>>>;

/// The files of one container that were written, and its folders.
#[derive(Debug)]
pub(super) struct Fs {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

impl Fs {
    /// A container's file system as it starts.
    pub(super) fn new(pod: &Pod) -> Self {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let dirs = [
            "/", "/bin", "/dev", "/etc", "/home", "/proc", "/root", "/sys", "/tmp", "/usr",
            "/usr/bin", "/var",
        ]
        .map(str::to_owned)
        .into();
        let files = [
            ("/etc/hostname".to_owned(), format!("{name}\n").into_bytes()),
            (
                "/etc/hosts".to_owned(),
                format!("127.0.0.1\tlocalhost\n{ip}\t{name}\n").into_bytes(),
            ),
        ]
        .into();
        Self { files, dirs }
    }
}

/// A file or folder, normalised: absolute, without `.`, `..` or repeated `/`.
fn normalise(cwd: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{cwd}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn parent(path: &str) -> String {
    match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
    }
}

/// Where a path lies in the container's volumes.
enum Place {
    /// In a ConfigMap or Secret volume (read-only): the volume and the path inside it.
    Projected(String, String),
    /// Anywhere else.
    Plain,
}

/// What one exec runs against.
pub(super) struct Context<'a> {
    pub(super) pod: &'a Pod,
    pub(super) container: &'a Container,
    pub(super) client: &'a kube::Client,
    pub(super) allocatable: BTreeMap<String, String>,
    pub(super) fs: Arc<Mutex<Fs>>,
}

/// What a command printed, and how it ended.
#[derive(Default)]
struct Outcome {
    out: Vec<u8>,
    err: Vec<u8>,
    code: i32,
}

impl Outcome {
    fn fail(code: i32, message: String) -> Self {
        Self {
            err: message.into_bytes(),
            code,
            ..Self::default()
        }
    }
}

/// A session's state.
struct Session<'a, 'b> {
    ctx: &'a Context<'b>,
    cwd: String,
    env: Option<BTreeMap<String, String>>,
    last: i32,
    exit: Option<i32>,
    tty: bool,
    /// Reading commands from a terminal (stdin is the shell's, not a command's).
    interactive: bool,
}

/// How long a process takes to start in a container (the runtime's exec). Output sent at once
/// can beat kubectl's WebSocket client to setting up its streams, which then drops it ("Unknown
/// stream id 1, discarding message"): a prompt, or the start of `kubectl cp`'s tar stream.
const PROCESS_START: std::time::Duration = std::time::Duration::from_millis(250);

/// Runs `argv` as `kubectl exec` asked.
pub(super) async fn exec(ctx: &Context<'_>, argv: Vec<String>, io: &mut ExecIo) -> ExitStatus {
    tokio::time::sleep(PROCESS_START).await;
    let mut session = Session {
        ctx,
        cwd: ctx
            .container
            .working_dir
            .clone()
            .filter(|d| d.starts_with('/'))
            .unwrap_or_else(|| "/".to_owned()),
        env: None,
        last: 0,
        exit: None,
        tty: io.tty,
        interactive: false,
    };
    let program = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_owned());
    let is_shell = matches!(program.as_deref(), Some("sh" | "bash" | "ash"));
    let rest: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
    let code = match (is_shell, rest.as_slice()) {
        (true, ["-c", script, ..]) => {
            session.script(script, io).await;
            session.exit.unwrap_or(session.last)
        }
        (true, flags)
            if flags
                .iter()
                .all(|f| matches!(*f, "-i" | "-l" | "-il" | "-li")) =>
        {
            if io.tty {
                session.terminal(io).await
            } else {
                session.lines(io).await
            }
        }
        _ => {
            let known = program.as_deref().is_some_and(|p| COMMANDS.contains(&p));
            if !known {
                let name = argv.first().cloned().unwrap_or_default();
                return ExitStatus::Error(format!(
                    "failed to exec in container: exec: \"{name}\": executable file not found in $PATH"
                ));
            }
            session.command(argv, None, io).await;
            session.exit.unwrap_or(session.last)
        }
    };
    if let Some(out) = io.stdout.as_mut() {
        let _ = out.shutdown().await;
    }
    match code {
        0 => ExitStatus::Success,
        c => ExitStatus::ExitCode(c),
    }
}

/// One token of a script.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// `;`, new line, `&&`, `||`, `|`, `>`, `>>`, `&`.
    Op(&'static str),
}

impl Session<'_, '_> {
    async fn env(&mut self) -> BTreeMap<String, String> {
        if let Some(env) = &self.env {
            return env.clone();
        }
        let ctx = self.ctx;
        let objects = super::env::objects(ctx.client, ctx.pod, ctx.container, true).await;
        let mut vars = super::env::resolve(ctx.pod, ctx.container, &objects, &ctx.allocatable)
            .unwrap_or_default();
        vars.entry("HOSTNAME".into())
            .or_insert_with(|| ctx.pod.metadata.name.clone().unwrap_or_default());
        vars.entry("PATH".into()).or_insert_with(|| PATH.into());
        vars.entry("HOME".into()).or_insert_with(|| "/root".into());
        if self.tty {
            vars.entry("TERM".into()).or_insert_with(|| "xterm".into());
        }
        self.env = Some(vars.clone());
        vars
    }

    /// Splits a script into words and operators, expanding `$VAR` outside single quotes.
    async fn tokens(&mut self, script: &str) -> Result<Vec<Token>, String> {
        let env = self.env().await;
        let last = self.last.to_string();
        let var = |name: &str| -> String {
            if name == "?" {
                return last.clone();
            }
            env.get(name).cloned().unwrap_or_default()
        };
        let mut tokens = Vec::new();
        let mut word = String::new();
        let mut in_word = false;
        let mut chars = script.chars().peekable();
        let flush = |word: &mut String, in_word: &mut bool, tokens: &mut Vec<Token>| {
            if *in_word {
                tokens.push(Token::Word(std::mem::take(word)));
                *in_word = false;
            }
        };
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    in_word = true;
                    loop {
                        match chars.next() {
                            Some('\'') => break,
                            Some(c) => word.push(c),
                            None => return Err("unterminated quoted string".into()),
                        }
                    }
                }
                '"' => {
                    in_word = true;
                    loop {
                        match chars.next() {
                            Some('"') => break,
                            Some('\\') => {
                                if let Some(c) = chars.next() {
                                    word.push(c);
                                }
                            }
                            Some('$') => word.push_str(&expand_var(&mut chars, &var)),
                            Some(c) => word.push(c),
                            None => return Err("unterminated quoted string".into()),
                        }
                    }
                }
                '\\' => {
                    in_word = true;
                    if let Some(c) = chars.next() {
                        word.push(c);
                    }
                }
                '$' => {
                    in_word = true;
                    word.push_str(&expand_var(&mut chars, &var));
                }
                '#' if !in_word => {
                    // A comment, to the end of the line.
                    while chars.peek().is_some_and(|c| *c != '\n') {
                        chars.next();
                    }
                }
                ';' | '\n' => {
                    flush(&mut word, &mut in_word, &mut tokens);
                    tokens.push(Token::Op(";"));
                }
                '&' | '|' | '>' => {
                    flush(&mut word, &mut in_word, &mut tokens);
                    let doubled = chars.peek() == Some(&c);
                    if doubled {
                        chars.next();
                    }
                    tokens.push(Token::Op(match (c, doubled) {
                        ('&', true) => "&&",
                        ('&', false) => "&",
                        ('|', true) => "||",
                        ('|', false) => "|",
                        (_, true) => ">>",
                        _ => ">",
                    }));
                }
                c if c.is_whitespace() => flush(&mut word, &mut in_word, &mut tokens),
                c => {
                    in_word = true;
                    word.push(c);
                }
            }
        }
        flush(&mut word, &mut in_word, &mut tokens);
        Ok(tokens)
    }

    /// Runs a script; `self.last` is the status of its last command.
    async fn script(&mut self, script: &str, io: &mut ExecIo) {
        let tokens = match self.tokens(script).await {
            Ok(t) => t,
            Err(e) => {
                self.print(io, &Outcome::fail(2, format!("sh: syntax error: {e}\n")))
                    .await;
                self.last = 2;
                return;
            }
        };
        let mut words: Vec<String> = Vec::new();
        let mut redirect: Option<(bool, String)> = None;
        let mut run_next = true;
        let mut iter = tokens.into_iter().peekable();
        loop {
            let token = iter.next();
            match token {
                Some(Token::Word(w)) => words.push(w),
                Some(Token::Op(op @ (">" | ">>"))) => match iter.next() {
                    Some(Token::Word(path)) => redirect = Some((op == ">>", path)),
                    _ => {
                        self.print(
                            io,
                            &Outcome::fail(2, "sh: syntax error: nothing to redirect to\n".into()),
                        )
                        .await;
                        self.last = 2;
                        return;
                    }
                },
                Some(Token::Op(op @ ("|" | "&"))) => {
                    let what = if op == "|" {
                        "pipes"
                    } else {
                        "background jobs"
                    };
                    self.print(
                        io,
                        &Outcome::fail(
                            2,
                            format!("sh: {what} are not supported by the simulated shell\n"),
                        ),
                    )
                    .await;
                    self.last = 2;
                    return;
                }
                Some(Token::Op(_)) | None => {
                    let op = match &token {
                        Some(Token::Op(op)) => *op,
                        _ => ";",
                    };
                    if run_next && !words.is_empty() {
                        self.command(std::mem::take(&mut words), redirect.take(), io)
                            .await;
                        if self.exit.is_some() {
                            return;
                        }
                    }
                    words.clear();
                    redirect = None;
                    // A skipped command keeps the status before it (`false && a || b` runs b).
                    run_next = match op {
                        "&&" => self.last == 0,
                        "||" => self.last != 0,
                        _ => true,
                    };
                    if token.is_none() {
                        return;
                    }
                }
            }
        }
    }

    /// `sh` without a terminal: the lines from stdin, until it ends or `exit`.
    async fn lines(&mut self, io: &mut ExecIo) -> i32 {
        let Some(mut stdin) = io.stdin.take() else {
            return 0;
        };
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stdin.read(&mut buf).await.unwrap_or(0);
            if n > 0 {
                pending.extend_from_slice(&buf[..n]);
            }
            while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=at).collect();
                self.script(&String::from_utf8_lossy(&line), io).await;
                if let Some(code) = self.exit {
                    return code;
                }
            }
            if n == 0 {
                if !pending.is_empty() {
                    let line = String::from_utf8_lossy(&pending).into_owned();
                    self.script(&line, io).await;
                }
                return self.exit.unwrap_or(self.last);
            }
        }
    }

    fn prompt(&self) -> String {
        format!("{} # ", self.cwd)
    }

    /// `sh` on a terminal: prompt, echo and line editing, as a terminal in cooked mode.
    async fn terminal(&mut self, io: &mut ExecIo) -> i32 {
        let Some(mut stdin) = io.stdin.take() else {
            return 0;
        };
        self.interactive = true;
        write_raw(io, self.prompt().as_bytes()).await;
        let mut line: Vec<u8> = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stdin.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return self.last;
            }
            for &b in &buf[..n] {
                match b {
                    b'\r' | b'\n' => {
                        write_raw(io, b"\r\n").await;
                        let text = String::from_utf8_lossy(&line).into_owned();
                        line.clear();
                        self.script(&text, io).await;
                        if let Some(code) = self.exit {
                            return code;
                        }
                        write_raw(io, self.prompt().as_bytes()).await;
                    }
                    // Ctrl-C: the line is dropped.
                    0x03 => {
                        line.clear();
                        write_raw(io, b"^C\r\n").await;
                        write_raw(io, self.prompt().as_bytes()).await;
                    }
                    // Ctrl-D: ends the session on an empty line.
                    0x04 if line.is_empty() => {
                        write_raw(io, b"exit\r\n").await;
                        return self.last;
                    }
                    0x04 => {}
                    // Backspace or DEL.
                    0x08 | 0x7f => {
                        if line.pop().is_some() {
                            write_raw(io, b"\x08 \x08").await;
                        }
                    }
                    b if b < 0x20 && b != b'\t' => {}
                    b => {
                        line.push(b);
                        write_raw(io, &[b]).await;
                    }
                }
            }
        }
    }

    /// Writes a command's output (with CR LF on a terminal).
    async fn print(&self, io: &mut ExecIo, outcome: &Outcome) {
        let tty = self.tty;
        let translate = |bytes: &[u8]| -> Vec<u8> {
            if !tty {
                return bytes.to_vec();
            }
            let mut out = Vec::with_capacity(bytes.len() + 8);
            for &b in bytes {
                if b == b'\n' {
                    out.push(b'\r');
                }
                out.push(b);
            }
            out
        };
        if !outcome.out.is_empty() {
            write_raw(io, &translate(&outcome.out)).await;
        }
        if !outcome.err.is_empty() {
            let bytes = translate(&outcome.err);
            match io.stderr.as_mut() {
                Some(err) if !tty => {
                    let _ = err.write_all(&bytes).await;
                    let _ = err.flush().await;
                }
                _ => write_raw(io, &bytes).await,
            }
        }
    }

    /// Runs one command, its output into `redirect` (append?, path) or to the client.
    async fn command(
        &mut self,
        argv: Vec<String>,
        redirect: Option<(bool, String)>,
        io: &mut ExecIo,
    ) {
        let outcome = self.run(&argv, io).await;
        self.last = outcome.code;
        match redirect {
            None => self.print(io, &outcome).await,
            Some((append, path)) => {
                let path = normalise(&self.cwd, &path);
                let written = self.write_file(&path, &outcome.out, append);
                let mut shown = Outcome {
                    err: outcome.err,
                    code: outcome.code,
                    ..Outcome::default()
                };
                if let Err(e) = written {
                    shown
                        .err
                        .extend_from_slice(format!("sh: can't create {path}: {e}\n").as_bytes());
                    self.last = 1;
                }
                self.print(io, &shown).await;
            }
        }
    }

    fn place(&self, path: &str) -> Place {
        let container = self.ctx.container;
        let volumes = self
            .ctx
            .pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten());
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| {
                let at = m.mount_path.trim_end_matches('/');
                path == at || path.strip_prefix(at).is_some_and(|r| r.starts_with('/'))
            })
            .max_by_key(|m| m.mount_path.len());
        let Some(mount) = mount else {
            return Place::Plain;
        };
        let projected = volumes.filter(|v| v.name == mount.name).any(|v| {
            v.config_map.is_some()
                || v.secret.is_some()
                || v.projected.is_some()
                || v.downward_api.is_some()
        });
        if projected {
            let inside = path
                .strip_prefix(mount.mount_path.trim_end_matches('/'))
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned();
            Place::Projected(mount.mount_path.trim_end_matches('/').to_owned(), inside)
        } else {
            Place::Plain
        }
    }

    fn fs(&self) -> std::sync::MutexGuard<'_, Fs> {
        self.ctx
            .fs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_dir_local(&self, path: &str) -> bool {
        let fs = self.fs();
        fs.dirs.contains(path)
            || self
                .ctx
                .container
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path.trim_end_matches('/') == path)
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>, String> {
        match self.place(path) {
            Place::Projected(_, inside) if inside.is_empty() => Err("Is a directory".into()),
            Place::Projected(..) => {
                super::api::volume_file(self.ctx.client, self.ctx.pod, self.ctx.container, path)
                    .await
            }
            Place::Plain => {
                if self.is_dir_local(path) {
                    return Err("Is a directory".into());
                }
                self.fs()
                    .files
                    .get(path)
                    .cloned()
                    .ok_or_else(|| "No such file or directory".into())
            }
        }
    }

    fn write_file(&self, path: &str, bytes: &[u8], append: bool) -> Result<(), String> {
        if matches!(self.place(path), Place::Projected(..)) {
            return Err("Read-only file system".into());
        }
        if self.is_dir_local(path) {
            return Err("Is a directory".into());
        }
        if !self.is_dir_local(&parent(path)) {
            return Err("nonexistent directory".into());
        }
        let mut fs = self.fs();
        let file = fs.files.entry(path.to_owned()).or_default();
        if !append {
            file.clear();
        }
        file.extend_from_slice(bytes);
        Ok(())
    }

    /// The names in folder `path`, or None when it is not a folder.
    async fn list(&self, path: &str) -> Option<Vec<String>> {
        let mut names = BTreeSet::new();
        if let Place::Projected(root, inside) = self.place(path) {
            if !inside.is_empty() {
                return None;
            }
            for key in
                super::api::volume_keys(self.ctx.client, self.ctx.pod, self.ctx.container, &root)
                    .await
            {
                names.insert(key);
            }
            return Some(names.into_iter().collect());
        }
        if !self.is_dir_local(path) {
            return None;
        }
        let prefix = if path == "/" {
            "/".to_owned()
        } else {
            format!("{path}/")
        };
        let child = |p: &str| {
            p.strip_prefix(&prefix)
                .filter(|r| !r.is_empty() && !r.contains('/'))
                .map(str::to_owned)
        };
        {
            let fs = self.fs();
            names.extend(fs.files.keys().filter_map(|p| child(p)));
            names.extend(fs.dirs.iter().filter_map(|p| child(p)));
        }
        for m in self.ctx.container.volume_mounts.iter().flatten() {
            if let Some(name) = child(m.mount_path.trim_end_matches('/')) {
                names.insert(name);
            }
        }
        Some(names.into_iter().collect())
    }

    /// Every file under `path` (itself if a file), with its content.
    async fn collect(&self, path: &str, out: &mut Vec<(String, Vec<u8>)>) -> Result<(), String> {
        let mut stack = vec![path.to_owned()];
        let mut seen = 0usize;
        while let Some(p) = stack.pop() {
            seen += 1;
            if seen > 10_000 {
                return Err("too many files".into());
            }
            match self.list(&p).await {
                Some(children) => {
                    out.push((format!("{p}/"), Vec::new()));
                    for c in children.into_iter().rev() {
                        stack.push(if p == "/" {
                            format!("/{c}")
                        } else {
                            format!("{p}/{c}")
                        });
                    }
                }
                None => out.push((p.clone(), self.read_file(&p).await?)),
            }
        }
        Ok(())
    }

    async fn run(&mut self, argv: &[String], io: &mut ExecIo) -> Outcome {
        let name = argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .unwrap_or_default();
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        let ok = |text: String| Outcome {
            out: text.into_bytes(),
            ..Outcome::default()
        };
        match name {
            "echo" => {
                let (newline, words) = match args.first() {
                    Some(&"-n") => (false, &args[1..]),
                    _ => (true, &args[..]),
                };
                let mut text = words.join(" ");
                if newline {
                    text.push('\n');
                }
                ok(text)
            }
            "true" | ":" => Outcome::default(),
            "false" => Outcome::fail(1, String::new()),
            "pwd" => ok(format!("{}\n", self.cwd)),
            "hostname" => ok(format!(
                "{}\n",
                self.ctx.pod.metadata.name.as_deref().unwrap_or_default()
            )),
            "whoami" => ok("root\n".into()),
            "id" => ok("uid=0(root) gid=0(root) groups=0(root)\n".into()),
            "uname" => ok(if args.contains(&"-a") {
                format!(
                    "Linux {} 6.1.0-sim #1 SMP x86_64 GNU/Linux\n",
                    self.ctx.pod.metadata.name.as_deref().unwrap_or_default()
                )
            } else {
                "Linux\n".into()
            }),
            "date" => ok(format!(
                "{}\n",
                k8s_openapi::jiff::Timestamp::now().strftime("%a %b %e %H:%M:%S UTC %Y")
            )),
            "env" | "printenv" => {
                let env = self.env().await;
                if name == "printenv" && !args.is_empty() {
                    let found: Vec<String> =
                        args.iter().filter_map(|k| env.get(*k).cloned()).collect();
                    let code = i32::from(found.len() < args.len());
                    return Outcome {
                        out: found
                            .iter()
                            .map(|v| format!("{v}\n"))
                            .collect::<String>()
                            .into_bytes(),
                        code,
                        ..Outcome::default()
                    };
                }
                ok(env.iter().map(|(k, v)| format!("{k}={v}\n")).collect())
            }
            "exit" => {
                let code = match args.first().map(|c| c.parse::<i32>()) {
                    None => self.last,
                    Some(Ok(c)) => c,
                    Some(Err(_)) => 2,
                };
                self.exit = Some(code);
                Outcome {
                    code,
                    ..Outcome::default()
                }
            }
            "cd" => {
                let target = normalise(&self.cwd, args.first().copied().unwrap_or("/root"));
                if self.list(&target).await.is_some() {
                    self.cwd = target;
                    Outcome::default()
                } else {
                    Outcome::fail(
                        1,
                        format!(
                            "sh: cd: can't cd to {}: No such file or directory\n",
                            args.first().copied().unwrap_or_default()
                        ),
                    )
                }
            }
            "sleep" => {
                let secs = args
                    .first()
                    .and_then(|s| s.parse::<f64>().ok())
                    .unwrap_or(0.0)
                    .clamp(0.0, 3600.0);
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                Outcome::default()
            }
            "cat" if args.is_empty() || args == ["-"] => {
                // Copies stdin to stdout as it comes (not in a terminal session, where stdin
                // is the shell's).
                if !self.interactive
                    && let (Some(stdin), Some(stdout)) = (io.stdin.as_mut(), io.stdout.as_mut())
                {
                    let mut buf = [0u8; 8192];
                    loop {
                        let n = stdin.read(&mut buf).await.unwrap_or(0);
                        if n == 0 || stdout.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        let _ = stdout.flush().await;
                    }
                }
                Outcome::default()
            }
            "cat" => {
                let mut outcome = Outcome::default();
                for path in args {
                    let full = normalise(&self.cwd, path);
                    match self.read_file(&full).await {
                        Ok(bytes) => outcome.out.extend_from_slice(&bytes),
                        Err(e) => {
                            outcome
                                .err
                                .extend_from_slice(format!("cat: {path}: {e}\n").as_bytes());
                            outcome.code = 1;
                        }
                    }
                }
                outcome
            }
            "ls" => {
                let long = args.iter().any(|a| a.starts_with('-') && a.contains('l'));
                let paths: Vec<&str> = args
                    .iter()
                    .copied()
                    .filter(|a| !a.starts_with('-'))
                    .collect();
                let paths = if paths.is_empty() { vec!["."] } else { paths };
                let mut outcome = Outcome::default();
                for (i, path) in paths.iter().enumerate() {
                    let full = normalise(&self.cwd, path);
                    if paths.len() > 1 {
                        let sep = if i > 0 { "\n" } else { "" };
                        outcome
                            .out
                            .extend_from_slice(format!("{sep}{path}:\n").as_bytes());
                    }
                    match self.list(&full).await {
                        Some(names) => {
                            for n in names {
                                let line = if long {
                                    let child = normalise(&full, &n);
                                    let dir = self.list(&child).await.is_some();
                                    let size = if dir {
                                        4096
                                    } else {
                                        self.read_file(&child).await.map_or(0, |b| b.len())
                                    };
                                    let mode = if dir { "drwxr-xr-x" } else { "-rw-r--r--" };
                                    format!("{mode}    1 root     root     {size:>8} {n}\n")
                                } else {
                                    format!("{n}\n")
                                };
                                outcome.out.extend_from_slice(line.as_bytes());
                            }
                        }
                        None => match self.read_file(&full).await {
                            Ok(_) => outcome
                                .out
                                .extend_from_slice(format!("{path}\n").as_bytes()),
                            Err(_) => {
                                outcome.err.extend_from_slice(
                                    format!("ls: {path}: No such file or directory\n").as_bytes(),
                                );
                                outcome.code = 1;
                            }
                        },
                    }
                }
                outcome
            }
            "test" | "[" => {
                let mut args = args.clone();
                if name == "[" && args.last() == Some(&"]") {
                    args.pop();
                }
                let truth = match args.as_slice() {
                    [flag, path] => {
                        let full = normalise(&self.cwd, path);
                        match *flag {
                            "-d" => self.list(&full).await.is_some(),
                            "-f" => {
                                self.list(&full).await.is_none()
                                    && self.read_file(&full).await.is_ok()
                            }
                            "-e" => {
                                self.list(&full).await.is_some()
                                    || self.read_file(&full).await.is_ok()
                            }
                            "-n" => !path.is_empty(),
                            "-z" => path.is_empty(),
                            _ => false,
                        }
                    }
                    [a, "=", b] => a == b,
                    [a, "!=", b] => a != b,
                    [a] => !a.is_empty(),
                    _ => false,
                };
                Outcome {
                    code: i32::from(!truth),
                    ..Outcome::default()
                }
            }
            "mkdir" => {
                let parents = args.contains(&"-p");
                let mut outcome = Outcome::default();
                for path in args.iter().filter(|a| !a.starts_with('-')) {
                    let full = normalise(&self.cwd, path);
                    if let Err(e) = self.make_dir(&full, parents) {
                        outcome.err.extend_from_slice(
                            format!("mkdir: can't create directory '{path}': {e}\n").as_bytes(),
                        );
                        outcome.code = 1;
                    }
                }
                outcome
            }
            "touch" => {
                let mut outcome = Outcome::default();
                for path in args.iter().filter(|a| !a.starts_with('-')) {
                    let full = normalise(&self.cwd, path);
                    if let Err(e) = self.write_file(&full, b"", true) {
                        outcome
                            .err
                            .extend_from_slice(format!("touch: {path}: {e}\n").as_bytes());
                        outcome.code = 1;
                    }
                }
                outcome
            }
            "rm" => {
                let force = args.iter().any(|a| a.starts_with('-') && a.contains('f'));
                let recursive = args
                    .iter()
                    .any(|a| a.starts_with('-') && (a.contains('r') || a.contains('R')));
                let mut outcome = Outcome::default();
                for path in args.iter().filter(|a| !a.starts_with('-')) {
                    let full = normalise(&self.cwd, path);
                    if let Err(e) = self.remove(&full, recursive)
                        && !force
                    {
                        outcome.err.extend_from_slice(
                            format!("rm: can't remove '{path}': {e}\n").as_bytes(),
                        );
                        outcome.code = 1;
                    }
                }
                outcome
            }
            "stty" if args == ["size"] => {
                let Some(sizes) = io.resize.as_mut().filter(|_| io.tty) else {
                    return Outcome::fail(
                        1,
                        "stty: 'standard input': Inappropriate ioctl for device\n".into(),
                    );
                };
                let mut last = tokio::time::timeout(Duration::from_secs(1), sizes.recv())
                    .await
                    .ok()
                    .flatten();
                while let Ok(size) = sizes.try_recv() {
                    last = Some(size);
                }
                match last {
                    Some(size) => ok(format!("{} {}\n", size.height, size.width)),
                    None => Outcome::fail(1, "stty: no terminal size was reported\n".into()),
                }
            }
            "tar" => self.tar(&args, io).await,
            "sh" | "bash" | "ash" => match args.as_slice() {
                ["-c", script, ..] => {
                    let script = (*script).to_owned();
                    Box::pin(self.script(&script, io)).await;
                    let code = self.exit.take().unwrap_or(self.last);
                    Outcome {
                        code,
                        ..Outcome::default()
                    }
                }
                _ => Outcome::fail(
                    2,
                    "sh: only `sh -c SCRIPT` runs inside the simulated shell\n".into(),
                ),
            },
            other => Outcome::fail(127, format!("sh: {other}: not found\n")),
        }
    }

    fn make_dir(&self, path: &str, parents: bool) -> Result<(), String> {
        if matches!(self.place(path), Place::Projected(..)) {
            return Err("Read-only file system".into());
        }
        if self.is_dir_local(path) {
            return if parents {
                Ok(())
            } else {
                Err("File exists".into())
            };
        }
        if self.fs().files.contains_key(path) {
            return Err("File exists".into());
        }
        let up = parent(path);
        if !self.is_dir_local(&up) {
            if !parents {
                return Err("No such file or directory".into());
            }
            self.make_dir(&up, true)?;
        }
        self.fs().dirs.insert(path.to_owned());
        Ok(())
    }

    fn remove(&self, path: &str, recursive: bool) -> Result<(), String> {
        if matches!(self.place(path), Place::Projected(..)) {
            return Err("Read-only file system".into());
        }
        let mut fs = self.fs();
        if fs.files.remove(path).is_some() {
            return Ok(());
        }
        if !fs.dirs.contains(path) {
            return Err("No such file or directory".into());
        }
        if !recursive {
            return Err("Is a directory".into());
        }
        let prefix = format!("{path}/");
        fs.files.retain(|p, _| !p.starts_with(&prefix));
        fs.dirs.retain(|p| p != path && !p.starts_with(&prefix));
        Ok(())
    }

    /// `tar cf - PATH...` and `tar xf - [-C DIR]`, as `kubectl cp` runs them.
    async fn tar(&mut self, args: &[&str], io: &mut ExecIo) -> Outcome {
        let mut mode = None;
        let mut archive = None;
        let mut dir = self.cwd.clone();
        let mut paths = Vec::new();
        let mut iter = args.iter().copied().enumerate();
        while let Some((i, arg)) = iter.next() {
            let flags = if i == 0 && !arg.starts_with('-') {
                Some(arg)
            } else {
                arg.strip_prefix('-').filter(|f| !f.starts_with('-'))
            };
            match (arg, flags) {
                ("-C", _) => match iter.next() {
                    Some((_, d)) => dir = normalise(&self.cwd, d),
                    None => {
                        return Outcome::fail(
                            2,
                            "tar: option requires an argument -- 'C'\n".into(),
                        );
                    }
                },
                (_, Some(flags)) if flags.chars().all(|c| "cxtvfmpzo".contains(c)) => {
                    for c in flags.chars() {
                        match c {
                            'c' | 'x' | 't' => mode = Some(c),
                            'f' => archive = iter.next().map(|(_, a)| a),
                            _ => {}
                        }
                    }
                }
                (a, _) if a.starts_with("--") => {}
                (path, _) => paths.push(path),
            }
        }
        if archive != Some("-") {
            return Outcome::fail(
                2,
                "tar: only archives on stdin or stdout (f -) are supported\n".into(),
            );
        }
        match mode {
            Some('c') => {
                let mut files = Vec::new();
                for path in paths {
                    let full = normalise(&self.cwd, path);
                    if let Err(e) = self.collect(&full, &mut files).await {
                        return Outcome::fail(2, format!("tar: {path}: {e}\n"));
                    }
                }
                let mut builder = tar::Builder::new(Vec::new());
                for (path, bytes) in files {
                    let name = path.trim_start_matches('/');
                    let mut header = tar::Header::new_gnu();
                    let is_dir = name.ends_with('/');
                    header.set_entry_type(if is_dir {
                        tar::EntryType::Directory
                    } else {
                        tar::EntryType::Regular
                    });
                    header.set_mode(if is_dir { 0o755 } else { 0o644 });
                    header.set_size(bytes.len() as u64);
                    header.set_mtime(
                        u64::try_from(k8s_openapi::jiff::Timestamp::now().as_second()).unwrap_or(0),
                    );
                    if let Err(e) = builder.append_data(&mut header, name, bytes.as_slice()) {
                        return Outcome::fail(2, format!("tar: {name}: {e}\n"));
                    }
                }
                match builder.into_inner() {
                    Ok(out) => Outcome {
                        out,
                        ..Outcome::default()
                    },
                    Err(e) => Outcome::fail(2, format!("tar: {e}\n")),
                }
            }
            Some('x') => {
                let mut input = Vec::new();
                if let Some(stdin) = io.stdin.as_mut() {
                    // Bounded, as the files live in memory.
                    let mut limited = stdin.take(256 << 20);
                    if let Err(e) = limited.read_to_end(&mut input).await {
                        return Outcome::fail(2, format!("tar: reading stdin: {e}\n"));
                    }
                }
                self.extract(&input, &dir)
            }
            _ => Outcome::fail(2, "tar: need one of -c or -x\n".into()),
        }
    }

    fn extract(&self, input: &[u8], dir: &str) -> Outcome {
        if !self.is_dir_local(dir) {
            return Outcome::fail(
                2,
                format!("tar: can't change directory to '{dir}': No such file or directory\n"),
            );
        }
        let mut archive = tar::Archive::new(input);
        let entries = match archive.entries() {
            Ok(e) => e,
            Err(e) => return Outcome::fail(2, format!("tar: invalid archive: {e}\n")),
        };
        let mut outcome = Outcome::default();
        for entry in entries {
            let mut entry = match entry {
                Ok(e) => e,
                Err(e) => return Outcome::fail(2, format!("tar: invalid archive: {e}\n")),
            };
            let name = match entry.path() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => return Outcome::fail(2, format!("tar: invalid name: {e}\n")),
            };
            let target = normalise(dir, &name);
            // `..` cannot leave the folder: normalised against it, a name stays below it
            // unless it climbs out, which tar refuses.
            if !(target == dir || target.starts_with(&format!("{}/", dir.trim_end_matches('/')))) {
                outcome.err.extend_from_slice(
                    format!("tar: {name}: refusing to extract outside {dir}\n").as_bytes(),
                );
                outcome.code = 2;
                continue;
            }
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                if let Err(e) = self.make_dir(&target, true) {
                    outcome
                        .err
                        .extend_from_slice(format!("tar: {name}: {e}\n").as_bytes());
                    outcome.code = 2;
                }
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let mut bytes = Vec::new();
            if let Err(e) = std::io::Read::read_to_end(&mut entry, &mut bytes) {
                return Outcome::fail(2, format!("tar: {name}: {e}\n"));
            }
            let written = self
                .make_dir(&parent(&target), true)
                .and_then(|()| self.write_file(&target, &bytes, false));
            if let Err(e) = written {
                outcome
                    .err
                    .extend_from_slice(format!("tar: {name}: {e}\n").as_bytes());
                outcome.code = 2;
            }
        }
        outcome
    }
}

/// `$NAME`, `${NAME}` or `$?`, after the `$`.
fn expand_var(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    var: &impl Fn(&str) -> String,
) -> String {
    match chars.peek() {
        Some('{') => {
            chars.next();
            let mut name = String::new();
            for c in chars.by_ref() {
                if c == '}' {
                    break;
                }
                name.push(c);
            }
            var(&name)
        }
        Some('?') => {
            chars.next();
            var("?")
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let mut name = String::new();
            while let Some(c) = chars
                .peek()
                .copied()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                name.push(c);
                chars.next();
            }
            var(&name)
        }
        _ => "$".to_owned(),
    }
}

async fn write_raw(io: &mut ExecIo, bytes: &[u8]) {
    if let Some(out) = io.stdout.as_mut() {
        let _ = out.write_all(bytes).await;
        let _ = out.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_against_the_working_folder() {
        assert_eq!(normalise("/", "tmp"), "/tmp");
        assert_eq!(normalise("/tmp", "../etc/./hosts"), "/etc/hosts");
        assert_eq!(normalise("/tmp", "/../../x"), "/x");
        assert_eq!(parent("/tmp/a"), "/tmp");
        assert_eq!(parent("/tmp"), "/");
    }
}
