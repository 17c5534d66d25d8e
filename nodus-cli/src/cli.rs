//! The command line: every command and flag, as clap derives them, and the help text with
//! the exit codes.

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};

/// Shown after `nodus --help`.
pub const AFTER_HELP: &str = "\
Connection: `nodus login` saves a context (server, token, project) in
$XDG_CONFIG_HOME/nodus/config.yaml; NODUS_SERVER, NODUS_TOKEN and --project override it.

Exit codes:
  0  success
  1  the server refused the request (Error from server (Reason): …), or the input
     (a file, a document, a patch) cannot be used
  2  usage: the command line is wrong
  3  the server cannot be reached, or there is no usable login (not logged in,
     token not accepted)
  4  wait: the timeout passed before the condition held
  5  wait: the resource finished in a state that can never meet the condition";

/// The commands that do not talk to a server through a context: `--project` and `--context`
/// mean nothing to them, so their help leaves the two out and they refuse them.
const SERVERLESS: [&str; 2] = ["server", "quickstart"];

/// The command line as clap sees it: the [`SERVERLESS`] commands hold their own hidden
/// `--project` and `--context` (so the global ones are not propagated to them and their help
/// leaves them out), which [`parse_from`] refuses. Completion scripts are generated from it.
pub fn command() -> clap::Command {
    let mut command = Cli::command();
    for name in SERVERLESS {
        command = command.mut_subcommand(name, |sub| {
            ["project", "context"].into_iter().fold(sub, |sub, flag| {
                sub.arg(clap::Arg::new(flag).long(flag).hide(true).num_args(1))
            })
        });
    }
    command
}

/// Parses the process's arguments (see [`parse_from`]).
pub fn parse() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses a command line; `--project` or `--context` on `server` or `quickstart` is a usage
/// error (`NODUS_PROJECT` in the environment is not: it is meant for the other commands).
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = command();
    let matches = command.try_get_matches_from_mut(args)?;
    if let Some((name, sub)) = matches.subcommand()
        && SERVERLESS.contains(&name)
    {
        for flag in ["project", "context"] {
            let given =
                |m: &clap::ArgMatches| m.value_source(flag) == Some(ValueSource::CommandLine);
            if given(&matches) || given(sub) {
                return Err(command.error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "`nodus {name}` does not take --{flag}: it runs its own server in the \
                         project default; --{flag} is for the commands that talk to a server"
                    ),
                ));
            }
        }
    }
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// A value parser that takes any text but offers `values` to the completion scripts (the
/// kinds, where an argument is a KIND, a NAME or KIND/NAME).
#[derive(Clone)]
pub struct Offered(fn() -> Vec<&'static str>);

impl Offered {
    /// The kinds, by plural and short name.
    pub fn kinds() -> Offered {
        Offered(|| {
            nodus_core::resource::Kind::WRITABLE
                .into_iter()
                .filter_map(|kind| kind.info())
                .flat_map(|info| [Some(info.plural), info.short_name])
                .flatten()
                .chain(["postrunactions", "replicas"])
                .collect()
        })
    }
}

impl TypedValueParser for Offered {
    type Value = String;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        clap::builder::StringValueParser::new().parse_ref(command, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new((self.0)().into_iter().map(PossibleValue::new)))
    }
}

/// `-o`: [`parse_output`], offering the formats to the completion scripts.
#[derive(Clone)]
pub struct OutputParser;

impl TypedValueParser for OutputParser {
    type Value = Output;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Output, clap::Error> {
        parse_output.parse_ref(command, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            ["yaml", "json", "wide", "name", "jsonpath="]
                .into_iter()
                .map(PossibleValue::new),
        ))
    }
}

/// Run LLM agents as durable, cost-capped runs in sandboxes.
#[derive(Debug, Parser)]
#[command(name = "nodus", version, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    /// Connection and project.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// The project to work in (default: the context's, else `default`).
    #[arg(long, global = true, env = "NODUS_PROJECT")]
    pub project: Option<String>,
    /// The context to use instead of the current one.
    #[arg(long, global = true)]
    pub context: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the Nodus server (the embedded default needs no flags).
    Server(ServerArgs),
    /// Run a first agent on the embedded default and show its answer, turns and steps.
    Quickstart(QuickstartArgs),
    /// Check a token against a server and save it as the current context.
    Login(LoginArgs),
    /// Show or choose the saved contexts.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Create or update resources from YAML or JSON documents.
    Apply(ApplyArgs),
    /// List resources, or show some (`get KIND`, `get KIND NAME`, `get KIND/NAME`).
    Get(GetArgs),
    /// Wait until a resource meets a condition.
    Wait(WaitArgs),
    /// Create a run, a group, a project or a token from flags.
    #[command(subcommand)]
    Create(CreateCommand),
    /// Change a resource with a JSON merge patch.
    Patch(PatchArgs),
    /// Cancel a run (its sandbox is deleted) or every unfinished run of a group.
    Cancel(CancelArgs),
    /// Delete resources (a group goes with all of its runs).
    Delete(DeleteArgs),
    /// Work with one run: its answer, steps, messages and resolution.
    #[command(subcommand, visible_alias = "ar")]
    Agentrun(AgentRunCommand),
    /// Work with evaluation groups: compare two of them, retry the unscored
    /// cases, rescore with another grader.
    #[command(subcommand)]
    Eval(EvalCommand),
    /// Work with Environments: import the benchmarks you already have.
    #[command(subcommand)]
    Env(EnvCommand),
    /// Show the project's credits, or add to them (admin token).
    Credits(CreditsArgs),
    /// Print a shell completion script.
    Completion(CompletionArgs),
}

/// `nodus server`, or `nodus server drain NAME`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerArgs {
    /// Work with the fleet's replicas instead of starting one.
    #[command(subcommand)]
    pub action: Option<ServerCommand>,
    /// Where the API listens: HOST:PORT, the host an address or a name (localhost:7070).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Where state is kept: memory:, sqlite://PATH or postgres://… (default: SQLite in the
    /// data directory).
    #[arg(long)]
    pub store: Option<String>,
    /// Where commands run: process, docker or unisolated.
    #[arg(long, default_value = "process")]
    pub sandbox: String,
    /// The data directory (default: $XDG_DATA_HOME/nodus or ~/.local/share/nodus).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Register this admin token instead of generating one.
    #[arg(long, env = "NODUS_BOOTSTRAP_TOKEN", hide_env_values = true)]
    pub bootstrap_token: Option<String>,
    /// The image of container sandboxes for runs that name none (--sandbox docker).
    #[arg(long)]
    pub default_image: Option<String>,
    /// A Docker engine for --sandbox docker, repeatable: unix:///PATH or tcp://HOST:PORT
    /// (TLS, see --docker-tls-dir), with =N the most sandboxes it holds at once (default:
    /// --capacity). A new sandbox goes to the engine with the most room; one whose engine
    /// stops answering is made again on another (default: the local socket only).
    #[arg(long, value_name = "URL[=CAPACITY]")]
    pub docker_host: Vec<String>,
    /// The directory holding ca.pem, cert.pem and key.pem for tcp:// Docker hosts, as the
    /// Docker CLI's --tlsverify reads them.
    #[arg(long, value_name = "DIR")]
    pub docker_tls_dir: Option<PathBuf>,
    /// Where process sandboxes keep their working directories (default: DATA_DIR/sandboxes;
    /// as root, /var/lib/nodus/sandboxes/<hash of DATA_DIR>, which the sandboxes' user,
    /// nobody, can reach).
    #[arg(long)]
    pub sandbox_dir: Option<PathBuf>,
    /// What starts process sandboxes: launcher (this binary's own launcher; bubblewrap when
    /// it fails its self-check on this host) or bubblewrap.
    #[arg(long, default_value = "launcher")]
    pub sandbox_starter: String,
    /// Internal hosts, addresses and CIDRs the webhook post-run action may reach, separated
    /// by commas (127.0.0.1,10.0.0.0/8,hooks.internal); by default it refuses loopback,
    /// private, link-local and cloud metadata addresses.
    #[arg(long, env = "NODUS_WEBHOOK_ALLOW")]
    pub webhook_allow: Option<String>,
    /// Export OpenTelemetry traces over OTLP/HTTP (protobuf) to this collector's base URL
    /// (spans go to URL/v1/traces); extra request headers, such as an API key, come from
    /// OTEL_EXPORTER_OTLP_HEADERS (key=value,key=value) and are never printed.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Include message content in the exported spans (the system prompt, what each model call
    /// was sent and its reply, commands and their output; a run's Secret values replaced by
    /// [redacted]); off by default, since prompts and output can hold secrets.
    #[arg(long)]
    pub otlp_content: bool,
    /// Internal addresses and CIDRs the egress proxy may reach for runs, separated by commas
    /// (127.0.0.1,10.20.0.0/16); by default it refuses loopback, private, link-local and
    /// cloud metadata addresses, and a run's allowlist cidr must lie inside one of these.
    #[arg(long, env = "NODUS_EGRESS_ALLOW")]
    pub egress_allow: Option<String>,
    /// Bytes of new working-directory content each run's snapshots may keep (1 GiB by
    /// default); past it, a run's later steps cannot be forked from.
    #[arg(long, value_name = "BYTES", default_value_t = nodus_core::snapshot::DEFAULT_BUDGET_BYTES)]
    pub snapshot_budget: u64,
    /// Whether runs' working directories are snapshotted after each command (`on` by
    /// default); with `off`, no step of a run driven by this server can be forked from.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub snapshots: Switch,
    /// A hosts file (lines `ADDRESS NAME...`) whose names the egress proxy resolves itself,
    /// before the system's resolver.
    #[arg(long, env = "NODUS_EGRESS_HOSTS")]
    pub egress_hosts: Option<PathBuf>,
    /// Connections one run's sandbox may hold open through the egress proxy at once; past it
    /// the next waits until one ends.
    #[arg(long, value_name = "N", default_value_t = nodus_server::egress_proxy::DEFAULT_MAX_CONNECTIONS as u64,
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub egress_max_connections: u64,
    /// Bytes (both ways together) one run's connections through the egress proxy may carry
    /// (1 GiB by default): the connection that passes it is cut off, later ones are refused,
    /// and the run's egress records say so.
    #[arg(long, value_name = "BYTES", default_value_t = nodus_server::egress_proxy::DEFAULT_MAX_BYTES,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub egress_max_bytes: u64,
    /// A PEM file of certificates the egress proxy trusts, besides the system's roots, when it
    /// speaks TLS onward for a run's injected headers (an internal authority; the tests').
    #[arg(long, env = "NODUS_EGRESS_CA", value_name = "FILE")]
    pub egress_ca: Option<PathBuf>,
    /// HTTP connections served at once (at most half the open-file limit); more wait in the
    /// kernel's backlog.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Seconds a connection may take to send a request's headers (also closes idle
    /// connections), and a request body may pause; a body's deadline is this plus its length
    /// at 256 KiB/s.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// MiB that every request body being read may hold together; past it: 503.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_body_memory: u64,
    /// Request bodies one token may be sending at once; past it: 429.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bodies_per_token: u64,
    /// Streams and long polls (watches, logs --follow, console events) one token may hold
    /// open; past it: 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_streams_per_token: u64,
    /// Event streams one console session may hold open; past it: 429.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_streams_per_session: u64,
    /// Live sandboxes at once on this replica: it drives at most this many runs at once and
    /// leaves the others to other replicas (default: 4 per CPU, at most one per 512 MiB of
    /// memory).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub capacity: Option<u64>,
    /// What this replica does: all (serve the API and drive runs), api (serve the API, drive
    /// nothing) or worker (drive runs, serve only /healthz and /metrics).
    #[arg(long, default_value = "all")]
    pub role: String,
    /// Seconds a drain (SIGTERM, Ctrl-C) lets running commands finish before it cuts them;
    /// then every run this replica drove is handed over to the others at once.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub drain_timeout: u64,
}

/// What `nodus server` does besides serving.
#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    /// Ask the replica NAME (`nodus get replicas` lists them) to drain, as SIGTERM does: it
    /// stops taking runs, lets its running commands finish up to its --drain-timeout, hands its
    /// runs over to the other replicas and stops. Needs the server's operator token.
    Drain(DrainArgs),
}

/// `nodus server drain NAME`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The replica's name.
    pub name: String,
    /// The context to use instead of the current one.
    #[arg(long, value_name = "CONTEXT")]
    pub context: Option<String>,
}

/// `nodus quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// The data directory (default: $XDG_DATA_HOME/nodus or ~/.local/share/nodus).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// `nodus login`.
#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The server's URL (default: the local server, http://127.0.0.1:7070).
    #[arg(long)]
    pub server: Option<String>,
    /// The token (`-` reads it from standard input; default: the local server's token file).
    #[arg(long)]
    pub token: Option<String>,
    /// The name of the context to save (default: `local`, or the server's host).
    #[arg(long = "name")]
    pub name: Option<String>,
    /// The data directory whose token file a local login reads.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// `nodus config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// List the saved contexts.
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
    /// Make a saved context the current one.
    UseContext {
        /// The context's name.
        name: String,
    },
}

/// `-o`: how objects are printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A table (the default).
    Table,
    /// A table with more columns.
    Wide,
    /// YAML.
    Yaml,
    /// JSON.
    Json,
    /// `kind.nodus.dev/NAME`.
    Name,
    /// A JSONPath template.
    JsonPath(String),
}

/// Parses `-o`.
pub fn parse_output(text: &str) -> Result<Output, String> {
    Ok(match text {
        "wide" => Output::Wide,
        "yaml" => Output::Yaml,
        "json" => Output::Json,
        "name" => Output::Name,
        other => match other.split_once('=') {
            Some(("jsonpath", template)) => Output::JsonPath(template.to_string()),
            _ => {
                return Err(format!(
                    "-o takes yaml, json, wide, name or jsonpath=TEMPLATE, not {other:?}"
                ));
            }
        },
    })
}

/// `nodus apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A file or directory of YAML/JSON documents, or `-` for standard input.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
}

/// `nodus get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// KIND, KIND NAME…, or KIND/NAME….
    #[arg(required = true, num_args = 1.., value_parser = Offered::kinds(), hide_possible_values = true)]
    pub targets: Vec<String>,
    /// Output: yaml, json, wide, name or jsonpath=TEMPLATE.
    #[arg(short, long, value_parser = OutputParser, hide_possible_values = true)]
    pub output: Option<Output>,
    /// Label selector: key=value,key=value.
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Field selector: spec.group=x,status.phase=Running. Values match exactly, case
    /// included: status.phase=Running, not running. An agent's runs:
    /// status.snapshot.agentRef=PROJECT/NAME, or spec.agent=NAME as the runs name it.
    #[arg(long)]
    pub field_selector: Option<String>,
    /// Print only the first N objects of a list (in creation order).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Read a list from the server in chunks of this many objects (1 to 1000), as kubectl's
    /// --chunk-size: every chunk is printed, together.
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub chunk_size: u64,
    /// After printing the list or object, watch it: print each change as it comes (a row,
    /// or the object in the chosen format), as kubectl get -w, until the server ends the
    /// watch (an hour at most) or Ctrl-C.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// `nodus wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// KIND/NAME, such as agentrun/hello-agent-run.
    pub target: String,
    /// The condition: jsonpath='{.status.phase}'=VALUE.
    #[arg(long = "for")]
    pub condition: String,
    /// How long to wait: 30s, 8m, 1h30m (0: check once).
    #[arg(long, default_value = "30s")]
    pub timeout: String,
}

/// `nodus create …`.
#[derive(Debug, Subcommand)]
pub enum CreateCommand {
    /// Create a run of an agent.
    #[command(visible_alias = "ar")]
    Agentrun(CreateRunArgs),
    /// Create a group of runs.
    #[command(visible_alias = "ag")]
    Agentgroup(CreateGroupArgs),
    /// Create a project (the server's operator token).
    Project(CreateProjectArgs),
    /// Create a token of the project (admin token); its secret is printed this once.
    Token(CreateTokenArgs),
}

/// `nodus create project`.
#[derive(Debug, Args)]
pub struct CreateProjectArgs {
    /// The project's name (a DNS label).
    pub name: String,
}

/// `nodus create token`.
#[derive(Debug, Args)]
pub struct CreateTokenArgs {
    /// The token's name in its project (a DNS label).
    pub name: String,
    /// What it may do: read (get, list, watch), write (and create, change, delete, send,
    /// cancel, resolve, close) or admin (and credits, budgets, tokens).
    #[arg(long, value_enum)]
    pub role: TokenRole,
    /// When it stops working, from now: 30d, 12h, 90m, 1d12h (default: never).
    #[arg(long)]
    pub expires: Option<String>,
}

/// A feature of the server, on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// A token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenRole {
    /// Get, list and watch.
    Read,
    /// And create, change, delete, send, cancel, resolve and close.
    Write,
    /// And credits, budgets and tokens.
    Admin,
}

impl TokenRole {
    /// As the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            TokenRole::Read => "read",
            TokenRole::Write => "write",
            TokenRole::Admin => "admin",
        }
    }
}

/// `nodus create agentrun`.
#[derive(Debug, Args)]
pub struct CreateRunArgs {
    /// The run's name (optional for a group task: `<group>-<taskKey>`).
    pub name: Option<String>,
    /// The agent (or the template claude-assistant).
    #[arg(long)]
    pub agent: String,
    /// The first prompt (`-` reads it from standard input).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Wait for messages after each turn instead of finishing.
    #[arg(long)]
    pub keep_alive: bool,
    /// When the run must end: an RFC 3339 time, or a duration from now (30m, 2h).
    #[arg(long)]
    pub deadline: Option<String>,
    /// The group the run belongs to.
    #[arg(long)]
    pub group: Option<String>,
    /// The run's task key in its group.
    #[arg(long)]
    pub task_key: Option<String>,
    /// Task keys this run waits for (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub depends_on: Vec<String>,
    /// The AgentEnvironment (`name` or `project/name`): env vars, Secrets, compute.
    #[arg(long)]
    pub environment: Option<String>,
    /// Whether the run's results include its `trajectory` (ATIF JSON built from its
    /// journal): `--auto-telemetry=false` saves none.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_telemetry: bool,
    /// Labels: key=value (repeatable).
    #[arg(short = 'l', long = "label")]
    pub labels: Vec<String>,
}

/// `nodus create agentgroup`.
#[derive(Debug, Args)]
pub struct CreateGroupArgs {
    /// The group's name.
    pub name: String,
    /// The agent every run of the group uses.
    #[arg(long)]
    pub agent: String,
    /// Runs that may go at once.
    #[arg(long)]
    pub max_active: Option<u32>,
    /// Unfinished runs the group takes in.
    #[arg(long)]
    pub max_pending: Option<u32>,
    /// One cap for the whole group's model spend, in dollars (0.60).
    #[arg(long)]
    pub max_cost: Option<String>,
    /// Seal the group at once (no runs can be added).
    #[arg(long)]
    pub sealed: bool,
    /// Labels: key=value (repeatable).
    #[arg(short = 'l', long = "label")]
    pub labels: Vec<String>,
}

/// `nodus patch`.
#[derive(Debug, Args)]
pub struct PatchArgs {
    /// KIND/NAME.
    pub target: String,
    /// A JSON merge patch, such as '{"spec":{"sealed":true}}'.
    #[arg(short, long)]
    pub patch: String,
}

/// `nodus cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// KIND/NAME…, or KIND NAME… (agentruns or agentgroups).
    #[arg(required = true, num_args = 1.., value_parser = Offered::kinds(), hide_possible_values = true)]
    pub targets: Vec<String>,
}

/// `nodus delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// KIND/NAME…, or KIND NAME….
    #[arg(value_parser = Offered::kinds(), hide_possible_values = true)]
    pub targets: Vec<String>,
    /// Delete what these files describe.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,
    /// Succeed when an object does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
}

/// `nodus eval …`.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Compare evaluation group B against A (the same Environment version, split and seed):
    /// each task's outcome in both, and the paired difference in pass rate (B − A) with its
    /// 95 % interval (Newcombe's method 10).
    Compare {
        /// The baseline evaluation group.
        a: String,
        /// The evaluation group compared against it.
        b: String,
        /// Output: yaml or json (default: a table and a summary).
        #[arg(short, long, value_parser = OutputParser, hide_possible_values = true)]
        output: Option<Output>,
    },
    /// Retry the unscored cases of a finished evaluation group: each gets a new attempt (a new
    /// run of the same task, recorded in the same group); a scored case is never retried.
    Retry {
        /// The evaluation group.
        group: String,
        /// Only cases unscored for these reasons (RunFailed, NoAnswer, LimitReached,
        /// GraderFailed, EvaluationTimeout, Cancelled); default: any.
        #[arg(long = "reason", value_delimiter = ',')]
        reasons: Vec<String>,
        /// Only the cases of these task ids; default: every task.
        #[arg(long = "task", value_delimiter = ',')]
        tasks: Vec<String>,
    },
    /// Grade a finished evaluation group's work again with another Environment version's
    /// grader, as a new evaluation group (spec.evaluation.rescoreOf): no model call, no agent
    /// sandbox.
    Rescore {
        /// The finished evaluation group.
        group: String,
        /// The Environment version whose grader grades (`name@version`); its tasks must be
        /// the group's.
        #[arg(long)]
        environment: String,
        /// The new group's name (default: GROUP-rescore).
        #[arg(long)]
        name: Option<String>,
    },
}

/// `nodus env …`.
#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Turn a benchmark into an Environment (and the FileSets it names) and apply them, or
    /// print them with -o yaml. Nothing is written when anything is refused.
    #[command(subcommand)]
    Import(ImportCommand),
}

/// `nodus env import …`.
#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Harbor task directories (task.toml, instruction.md, tests/test.sh, environment/): the
    /// instruction is the prompt, tests/ the grader's files, and the grader runs
    /// `bash /tests/test.sh` and reads the reward the tests write to /logs/verifier/.
    #[command(disable_version_flag = true)]
    Harbor {
        /// The task directories, one task each.
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Name, version, split, output.
        #[command(flatten)]
        target: ImportTarget,
        /// The image of the agent's and the grader's sandboxes, built by you from the tasks'
        /// environment/ (default: the tasks' environment.docker_image, which must agree).
        #[arg(long, conflicts_with = "no_image")]
        image: Option<String>,
        /// Name no image: the server's default image, or the host's system in process
        /// sandboxes.
        #[arg(long)]
        no_image: bool,
    },
    /// Inspect-style samples, one JSON object a line (`input`, `target`, optional `id`,
    /// `files`).
    #[command(disable_version_flag = true)]
    Jsonl {
        /// The JSON Lines file (`-` reads standard input).
        file: PathBuf,
        /// Name, version, split, output.
        #[command(flatten)]
        target: ImportTarget,
        /// How an answer is graded against the sample's target: exact, numeric or regex.
        #[arg(long)]
        grader: String,
    },
}

/// What an imported Environment is named, and whether it is printed instead of applied.
#[derive(Debug, Args)]
pub struct ImportTarget {
    /// The Environment's name.
    #[arg(long)]
    pub name: String,
    /// Its version (semantic: 1.0.0).
    #[arg(long)]
    pub version: String,
    /// The split the tasks go in.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Print the documents instead of applying them: yaml (documents `nodus apply -f`
    /// takes) or json (a List).
    #[arg(short, long, value_parser = OutputParser, hide_possible_values = true)]
    pub output: Option<Output>,
}

/// `nodus agentrun …`.
#[derive(Debug, Subcommand)]
pub enum AgentRunCommand {
    /// Print the run's whole answer.
    Answer {
        /// The run.
        name: String,
    },
    /// Save the run's final working directory (kept for runs with spec.workdir) as a tar
    /// archive.
    Workdir {
        /// The run.
        name: String,
        /// The file to write (`-` writes to standard output).
        file: std::path::PathBuf,
    },
    /// List a finished run's results with their sizes, or save one (`-o FILE`).
    Results {
        /// The run.
        name: String,
        /// The result to save: inputWorkdir, outputWorkdir, artifacts (.tar.gz), runRecord,
        /// error, trajectory (JSON), egress (JSON Lines).
        result: Option<String>,
        /// The file to write the result to (`-` writes to standard output; default: its
        /// file name, such as outputWorkdir.tar.gz).
        #[arg(short = 'o', long = "output-file")]
        file: Option<std::path::PathBuf>,
    },
    /// Print each step of the run and each command's output; with -f, as they happen, until
    /// the run ends.
    Logs {
        /// The run.
        name: String,
        /// Follow the run until it ends.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Print only the last N lines of what the run has done so far (then, with -f, all
        /// that follows), as kubectl logs --tail.
        #[arg(long, value_name = "N")]
        tail: Option<u64>,
        /// Print only the steps that finished within this duration (5m, 1h; commands' output
        /// lines carry no time of their own, so a step's finish time stands for its lines);
        /// unfinished steps are printed.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
    },
    /// List the connections the run's sandbox asked the egress proxy for (runs with an
    /// allowlist; kept when the run ends): time, host:port, address, verdict, rule, bytes,
    /// duration.
    Egress {
        /// The run.
        name: String,
        /// Output: json (an array) or jsonl (one record a line, as the result is kept);
        /// default: a table.
        #[arg(short, long, value_parser = ["json", "jsonl"])]
        output: Option<String>,
    },
    /// List what the run did, in order.
    Steps {
        /// The run.
        name: String,
        /// Output: yaml or json (default: a table).
        #[arg(short, long, value_parser = OutputParser, hide_possible_values = true)]
        output: Option<Output>,
        /// With each step's recorded intent and outcome (with -o yaml|json).
        #[arg(long)]
        payload: bool,
    },
    /// Send a message to a run.
    Send {
        /// The run.
        name: String,
        /// The message (`-` reads it from standard input).
        message: String,
        /// An idempotency key: the same key delivers the message once.
        #[arg(long)]
        key: Option<String>,
    },
    /// Fork the run from a command step: new runs that begin with its steps up to that one
    /// (inherited, not carried out again) and its working directory as it was after it.
    Fork {
        /// The run.
        name: String,
        /// The command step (its number in `agentrun steps`), or `last-good`: the last
        /// completed command before the first failed or uncertain step.
        #[arg(long = "at-step", alias = "at", value_name = "N|last-good")]
        at_step: String,
        /// How many forks.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// The fork's name (`-1`, `-2`… appended when several).
        #[arg(long = "name", value_name = "NEW")]
        fork_name: Option<String>,
        /// A new user message for the fork's next model call.
        #[arg(long)]
        input: Option<String>,
        /// Continue with another agent (its model and system prompt).
        #[arg(long)]
        agent: Option<String>,
        /// Cancel the source once the forks exist (a rewind).
        #[arg(long)]
        replace: bool,
    },
    /// Close a keepAlive conversation: the run answers its current turn, then succeeds
    /// (its sandbox is deleted) instead of waiting for more messages.
    Close {
        /// The run.
        name: String,
    },
    /// Resolve a run parked in NeedsResolution.
    Resolve {
        /// The run.
        name: String,
        /// What to do with the uncertain step.
        #[arg(long, value_enum)]
        action: ResolveAction,
    },
}

/// `--action` of `agentrun resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResolveAction {
    /// Run the uncertain step again.
    Retry,
    /// Record the step as failed and let the run go on.
    RecordFailed,
    /// Cancel the run.
    Cancel,
}

impl ResolveAction {
    /// The API's spelling.
    pub fn wire(self) -> &'static str {
        match self {
            ResolveAction::Retry => "retry",
            ResolveAction::RecordFailed => "recordFailed",
            ResolveAction::Cancel => "cancel",
        }
    }
}

/// `nodus credits`.
#[derive(Debug, Args)]
pub struct CreditsArgs {
    /// `add AMOUNT` adds credits in dollars (admin token).
    #[command(subcommand)]
    pub command: Option<CreditsCommand>,
}

/// `nodus credits add`.
#[derive(Debug, Subcommand)]
pub enum CreditsCommand {
    /// Add credits to the project.
    Add {
        /// Dollars, such as 5.00.
        amount: String,
    },
}

/// `nodus completion`.
#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    #[test]
    fn the_spec_commands_parse() {
        let lines = [
            "nodus login",
            "nodus apply -f agent.yaml",
            "nodus wait agentrun/hello-agent-run --for=jsonpath={.status.phase}=Succeeded --timeout=8m",
            "nodus get agentrun/hello-agent-run -o yaml",
            "nodus agentrun answer hello-agent-run",
            "nodus agentrun steps hello-agent-run",
            "nodus agentrun send hello-agent-run hello --key staging-1",
            "nodus create agentrun triage --agent hello-agent --prompt hi",
            "nodus create agentgroup parallel-agents --agent w --max-active 2 --max-cost 0.60",
            "nodus patch ag/parallel-agents --patch {}",
            "nodus get ag",
            "nodus get ar --field-selector spec.group=parallel-agents",
            "nodus get ar --field-selector status.snapshot.agentRef=default/hello-agent",
            "nodus cancel ag/parallel-agents",
            "nodus delete ag/parallel-agents",
            "nodus cancel agentrun/x",
            "nodus cancel agentrun x y",
            "nodus cancel ag parallel-agents",
            "nodus agentrun resolve x --action record-failed",
            "nodus credits add 5.00",
            "nodus completion zsh",
            "nodus get ar -o jsonpath={.items[*].metadata.name} --project team",
        ];
        for line in lines {
            let args = line.split(' ');
            if let Err(error) = Cli::try_parse_from(args) {
                panic!("{line}: {error}");
            }
        }
    }

    #[test]
    fn server_and_quickstart_neither_offer_nor_take_project_and_context() {
        let mut command = command();
        command.build();
        let help = command
            .find_subcommand_mut("server")
            .expect("server")
            .render_help()
            .to_string();
        assert!(help.contains("--listen"), "{help}");
        assert!(
            !help.contains("--project") && !help.contains("--context"),
            "{help}"
        );
        let get = command
            .find_subcommand_mut("get")
            .expect("get")
            .render_help()
            .to_string();
        assert!(
            get.contains("--project") && get.contains("--context"),
            "{get}"
        );
        assert!(
            get.contains("Values match exactly, case included"),
            "field selectors say they are case-sensitive: {get}"
        );
        for line in [
            "nodus quickstart --project team",
            "nodus server --context prod",
            "nodus --project team server",
        ] {
            let error = parse_from(line.split(" ")).expect_err(line);
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{line}"
            );
            assert!(error.to_string().contains("does not take --"), "{error}");
        }
        assert!(parse_from(["nodus", "server"]).is_ok());
        assert!(parse_from("nodus get ar --project team".split(' ')).is_ok());
    }

    #[test]
    fn completion_scripts_offer_kinds_and_output_formats() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut buffer = Vec::new();
            clap_complete::generate(shell, &mut command(), "nodus", &mut buffer);
            let script = String::from_utf8(buffer).expect("utf-8");
            for word in ["jsonpath=", "wide"] {
                assert!(script.contains(word), "{shell}: {word}");
            }
            // Fish completes the values of options only; bash and zsh offer the kinds too.
            if shell != clap_complete::Shell::Fish {
                for word in ["agentruns", "agentgroups", "filesets", "budgets"] {
                    assert!(script.contains(word), "{shell}: {word}");
                }
            }
        }
        // Offered, not required: names and KIND/NAME still parse.
        assert!(parse_from("nodus get ar/x ar/y -o jsonpath={.a}".split(' ')).is_ok());
    }

    #[test]
    fn output_formats_parse() {
        assert_eq!(parse_output("yaml"), Ok(Output::Yaml));
        assert_eq!(
            parse_output("jsonpath={.a}={.b}"),
            Ok(Output::JsonPath("{.a}={.b}".into()))
        );
        assert!(parse_output("xml").is_err());
    }
}
