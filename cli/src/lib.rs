//! `lbctl`: the command line over `lbd`'s API. Parsing, the request each command sends and
//! the rendering of replies live here so they can be tested without a daemon.

mod config_file;
mod flows;
mod health_args;
mod render;
mod render_health;
mod table;
pub mod top;

use std::{io, net::IpAddr, path::PathBuf};

use flows::{FLOWS_HELP, FlowsCommand};
use health_args::{BACKENDS_OPTIONS_HELP, BackendOptionArgs, HealthArgs, PORTS_HELP, VIPS_HEALTH_HELP, parse_deadline};

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use config_file::{APPLY_HELP, DIFF_HELP, EXPORT_HELP, FileArg, STATUS_HELP};
use spillway_common::maglev::MAX_WEIGHT;

use spillway_api::{
    DEFAULT_SOCKET, LimitPart, Request, RuleActionKind, Scope,
    client::{self, ClientError},
};
use spillway_manual::{self as docs, CompletionsArgs, ManArgs};
use spillway_model::{Cidr, DEFAULT_NONCE_LEN, DEFAULT_SERVER_ID_LEN, DEFAULT_WEIGHT, Encap, HashMode, MAX_RATE_PER_S, QuicConfig, Vip};

const LBCTL_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl stats -o json
  lbctl apply -f /etc/spillway/spillway.toml
  lbctl status

lbctl talks to lbd through its API socket and must run as root. A VIP is
<IP>:<PORT>/<tcp|udp>; port 0 means every port; IPv6 as [fd00::1]:443/tcp.";

const VIPS_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl vips list -o json
  lbctl vips remove 10.0.0.1:80/tcp";

const VIPS_ADD_HELP: &str = "\
Examples:
  lbctl vips add 10.0.0.1:80/tcp
  lbctl vips add 10.0.0.2:0/udp                       # every UDP port of 10.0.0.2
  lbctl vips add '[fd00::1]:443/tcp' --ring-size 4099
  lbctl vips add 10.0.0.2:8080/tcp --force            # an address of the balancer itself
  lbctl vips add 10.0.0.3:443/udp --quic --quic-server-id-len 2 --quic-nonce-len 6
  lbctl vips add 10.0.0.6:443/udp --quic --quic-config-id 1 --quic-key-file /etc/spillway/quic-1.key
  lbctl vips add 10.0.0.4:443/tcp --encap gue         # tunnel to its backends in GUE
  lbctl vips add 10.0.0.5:7777/udp --hash source      # every port of a client to one backend
  lbctl vips add '[fd00::5]:443/tcp' --hash source --source-prefix 64

--quic: short-header packets go by the server id in their destination connection
id (QUIC-LB, plaintext); each backend's server id is the last --quic-server-id-len
octets of its address (lbctl backends list shows it: give it to the server's
connection-id generator). Ids that do not decode go by the 5-tuple (counted).
With --quic-key-file the servers encrypt their ids (single pass when server id and
nonce sum to 16 octets, else four passes): lbd decrypts an id once and remembers
where it goes; decryptions are budgeted per CPU, an id over the budget goes by the
5-tuple (counted: placed=\"decrypted\", \"cached\", \"miss_over_budget\").

A VIP on an address of the balancer's own interfaces is refused without --force:
the balancer's own traffic to it (SSH to 10.0.0.2:22, BGP) would go to the VIP's
backends, or be dropped while it has none.

--encap: ipip (the default: IPIP, IP6IP6 or IPv4-in-IPv6) or gue (the same with a
UDP header to lbd's --gue-port, whose source port spreads flows over the backend's
RSS queues; 8 bytes more). Every agent decapsulates both (lbd agent --gue-port).

--hash: what Maglev hashes to place new flows. 5-tuple (the default) spreads a
client's connections over the backends; source hashes the client's address alone,
so every connection and UDP port of a client goes to one backend (sessions of
several connections, UDP sessions on changing ports). --source-prefix N hashes the
address's first N bits only (IPv4 1-32, IPv6 1-128; default the whole address): 64
keeps an IPv6 client's privacy addresses together. A backend change moves the same
share of clients as it moves flows under the 5-tuple; established connections keep
their backend. A QUIC VIP still sends short headers by connection id; the rest
follow --hash. lbctl apply -f changes the hash of an existing VIP.";

const VIPS_QUIC_NEXT_HELP: &str = "\
Example: a key rotation of 10.0.0.3:443/udp, whose servers issue config id 1
  lbctl vips quic-next 10.0.0.3:443/udp --quic-config-id 2 --quic-key-file /etc/spillway/quic-2.key
  (the servers move to config id 2, with the new key; the old connections finish)
  lbctl vips quic-retire 10.0.0.3:443/udp";

const VIPS_ENCAP_HELP: &str = "\
Example:
  lbctl vips encap 10.0.0.1:80/tcp gue

Changes the tunnel of every backend of the VIP that has no --encap of its own
(lbctl backends options): packets in flight keep arriving, each as the agent
decapsulates both. ipip or gue (see lbctl vips add --help).";

const VIPS_LIST_HELP: &str = "\
Example:
  lbctl vips list -o json

Columns:
  VIP             address:port/protocol (port 0: every port)
  RING_SIZE       slots of its Maglev table
  ENCAP           how its backends are tunnelled to (ipip or gue), unless their
                  own --encap says otherwise
  HASH            what places its new flows: 5-tuple, source (client affinity:
                  the client's address), or source/N (its first N bits)
  BACKENDS        every backend of the VIP, draining ones included
  PROBE           health check kind/probe path (tcp/tunnel, http/direct, ...);
                  - when the VIP is not checked
  HEALTHY_WEIGHT  weight of its healthy backends / total weight
  PANIC           no, or PANIC when too few backends are healthy, with
                  fail open (every backend gets traffic) or fail closed (none
                  does); notes: ejection capped (failed backends kept in by the
                  cap), N vip_path_failed (backends that answer directly but
                  not through the tunnel)
  BUDGET/S        new-flow budget in force; - for none
  SPILL/S         new flows per second its zone sends to other zones
  ANNOUNCED       the VIP address's BGP announcement (- without --bird-socket):
                    yes                      announced, serving
                    DEGRADED (reason, N/K peers)
                                             announced with GRACEFUL_SHUTDOWN
                                             (peers: other balancers announcing
                                             it normally, K: the floor); held:
                                             a withdrawal the floor holds back
                    no (reason)              withdrawn
                  reason: serving, no_backends, no_vip, program_detached,
                  interface_down, forwarding_disabled, restored (found announced
                  at start, decided on the first step). Load never withdraws.

JSON output (-o json):
  {\"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"ring_size\":65537,\"encap\":\"ipip\",\"hash\":\"5-tuple\",\"backends\":2,
             \"health\":{\"probe\":{\"kind\":\"tcp\"},\"panic\":false,\"panics_entered\":0,\"fail_closed\":false,
                       \"ejection_capped\":false,\"healthy_weight\":200,\"total_weight\":200,
                       \"ejected_weight\":0,\"spill_per_s\":0,\"policy\":{...}},
             \"effective_budget\":{\"per_s\":1000,\"burst\":100}}]}
  backends counts every backend of the VIP, draining ones included. hash is
  5-tuple or source; source_prefix (present when set) the source bits hashed. health is
  absent for VIPs that are not checked; effective_budget is the new-flow budget
  in force (the operator's, or lower when derived from declared capacity).";

const VIPS_REMOVE_HELP: &str = "\
Examples:
  lbctl vips remove 10.0.0.1:80/tcp
  lbctl vips remove 10.0.0.1:80/tcp --force           # with its backends

A VIP that still has backends is refused (naming how many backends and live
connections would break: its connection-table entries used within the idle
timeout), as lbctl apply refuses it without --allow-vip-removal: drain and
remove the backends first, or give --force.";

const BACKENDS_HELP: &str = "\
Examples:
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1 --weight 50
  lbctl backends list --vip 10.0.0.1:80/tcp
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1";

const BACKENDS_ADD_HELP: &str = "\
Examples:
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.1.2 --weight 50
  lbctl backends add --vip 10.0.0.1:80/tcp 10.0.2.1 --zone b --capacity 500
  lbctl backends add --vip '[fd00::1]:443/tcp' fd00:1::1

A new backend ramps up over the slow-start window. --zone, --capacity, --spare
and --probe-target: see lbctl backends options --help.";

const BACKENDS_LIST_HELP: &str = "\
Example:
  lbctl backends list --vip 10.0.0.1:80/tcp -o json

Columns:
  BACKEND     its address
  WEIGHT      the operator's weight (0 while draining)
  STATE       active or draining
  HEALTH      healthy, unhealthy, slow, slow_start, draining or held_down;
              (kept in): failed but kept by the ejection cap; (N unknown):
              probes the balancer itself could not make; - when not checked
  EFFECTIVE   the weight the data path uses after health, ejection cap, panic,
              zones and port pressure
  ZONE        its failure domain; - for none
  ENCAP       how it is tunnelled to: ipip or gue (its own, else its VIP's)
  LATENCY_MS  smoothed probe latency, in milliseconds to the microsecond
  PORTS       port pressure its agent reports: none, critical (ports nearly
              used up: weight reduced) or exhausted (connects failing for want
              of a port: no new flows, within the ejection cap); - without a
              report; agent unreachable when its agent stopped answering the
              polls (pressure unknown, health unchanged; an ALERT if it
              answered this lbd before)
  FOR_S       seconds in its health state
  SERVER_ID   QUIC VIPs only: the server id its connection ids carry (hex)
  REASON      why it is in that state: added, consecutive_failures,
              vip_path_failed, consecutive_successes, slow_start_complete,
              flapping, hold_down_expired, slower_than_peers,
              latency_recovered, operator_drain, operator_undrain, restored;
              (removed in N s) for a drain with a deadline

JSON output (-o json):
  {\"vip\":\"10.0.0.1:80/tcp\",
   \"backends\":[{\"address\":\"10.0.1.1\",\"weight\":100,\"state\":\"active\",
                 \"health\":\"healthy\",\"effective_weight\":100,
                 \"options\":{\"zone\":\"a\",\"capacity_per_s\":500},
                 \"reason\":\"slow_start_complete\",\"state_for_s\":42,
                 \"latency_ms\":0.214,\"pressure\":\"none\"}],
   \"alerts\":[]}
  state is \"active\" or \"draining\" (weight 0). health is healthy, unhealthy,
  slow, slow_start, draining or held_down; effective_weight is what the balancer
  uses after health, ejection caps, panic, zones and port pressure. kept_in marks
  a failed backend kept in by the ejection cap; unknown_probes counts probes the
  balancer itself could not make. alerts lists loud local problems.";

const BACKENDS_REMOVE_HELP: &str = "\
Example:
  lbctl backends remove --vip 10.0.0.1:80/tcp 10.0.1.1

Connections pinned to a removed backend move to another one; drain first to let
them finish.";

const BACKENDS_DRAIN_HELP: &str = "\
Examples:
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1
  lbctl backends drain --vip 10.0.0.1:80/tcp 10.0.1.1 --deadline 15m

Sets the weight to 0: existing connections stay on the backend, new ones go
elsewhere. With --deadline the backend is removed once it passes (the deadline
is kept across lbd restarts). Undo with set-weight. The VIP's last active
backend is drained only with --force: there is nowhere else for new flows, and
new connections to the VIP fail.";

const BACKENDS_SET_WEIGHT_HELP: &str = "\
Example:
  lbctl backends set-weight --vip 10.0.0.1:80/tcp 10.0.1.1 200";

const STATS_HELP: &str = "\
Example:
  lbctl stats -o json

Tables and columns:
  VIP, PACKETS, BYTES            what the data path forwarded per VIP
  VIP, BACKEND, PACKETS, BYTES   ... and per backend
  REASON, PACKETS                every verdict (tx, pass_*, drop_*), each packet
                                 counted under one
  OBSERVED, PACKETS              what observe-mode limits and rules would have
                                 dropped (forwarded, counted in REASON too)
  QUIC, PACKETS                  QUIC VIPs' short headers: quic_by_connection_id
                                 (to the backend their connection id names) or
                                 quic_fallback (the id named none: by 5-tuple)

JSON output (-o json):
  {\"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"packets\":10,\"bytes\":1500,
             \"backends\":[{\"address\":\"10.0.1.1\",\"packets\":10,\"bytes\":1500}]}],
   \"reasons\":[{\"reason\":\"tx\",\"packets\":10}, ...], \"observed\":[...],
   \"quic\":[{\"reason\":\"quic_fallback\",\"packets\":4}, ...]}
  reasons lists every verdict of the balancer, each packet counted under one.
  observed counts what limits and rules in observe mode would have dropped
  (would_drop_source_limit, would_drop_rule_block, would_drop_rule_limit,
  would_drop_vip_budget); those packets went through and are counted in reasons.
  quic counts QUIC short headers as the QUIC table does.";

const RATELIMIT_HELP: &str = "\
Examples:
  lbctl ratelimit set --default --per-source 100 --burst 200
  lbctl ratelimit budget --vip 10.0.0.1:80/tcp --new-flows 20000 --observe
  lbctl ratelimit list -o json
  lbctl ratelimit clear --vip 10.0.0.1:80/tcp --budget

Limits apply to new flows only: established connections are never shed. A VIP's
limits come part by part from its own settings, else from the default: a VIP
with its own budget still has the default per-source limit unless it sets its
own. --observe counts what a limit would drop (lbctl stats, observed) and drops
nothing; set it again without --observe to enforce.";

const RATELIMIT_SET_HELP: &str = "\
Examples:
  lbctl ratelimit set --default --per-source 100
  lbctl ratelimit set --vip 10.0.0.1:80/tcp --per-source 50 --burst 500 --source-prefix-v4 24
  lbctl ratelimit set --vip '[fd00::1]:443/tcp' --per-source 20 --source-prefix-v6 48 --observe

Each source prefix (/32 for IPv4 and /64 for IPv6 unless given) gets its own
bucket per VIP: --per-source new flows a second, plus --burst at once after a
quiet period (default: one second's worth). Replaces the scope's per-source
limit (prefix lengths and observe mode included) and keeps its budget.";

const RATELIMIT_BUDGET_HELP: &str = "\
Examples:
  lbctl ratelimit budget --vip 10.0.0.1:80/tcp --new-flows 20000
  lbctl ratelimit budget --vip 10.0.0.1:80/tcp --new-flows 20000 --burst 40000 --observe
  lbctl ratelimit budget --default --new-flows 50000

The VIP's new-flow budget: new flows above it are shed (load shedding), so the
backends' capacity is not exceeded. With --default, every VIP without its own
budget gets its own budget of this size. Keeps the scope's per-source limit.";

const RATELIMIT_CLEAR_HELP: &str = "\
Examples:
  lbctl ratelimit clear --vip 10.0.0.1:80/tcp              # both parts
  lbctl ratelimit clear --vip 10.0.0.1:80/tcp --budget
  lbctl ratelimit clear --default --per-source

A VIP whose own part is cleared falls back to the default's.";

const RATELIMIT_LIST_HELP: &str = "\
Example:
  lbctl ratelimit list -o json

Columns:
  SCOPE          default, or a VIP
  PER_SOURCE     the per-source limit: N/s burst B, then observe (counted, not
                 dropped) and (default) when the VIP inherits it; - for none
  SOURCE_PREFIX  /IPv4 /IPv6 prefix lengths that share one bucket
  BUDGET         the VIP's new-flow budget, written like PER_SOURCE

JSON output (-o json):
  {\"default\":{\"per_source\":{\"rate\":{\"per_s\":100,\"burst\":100},
                \"source_prefix_v4\":32,\"source_prefix_v6\":64,
                \"observe\":false,\"from\":\"default\"},
               \"vip_budget\":null},
   \"vips\":[{\"vip\":\"10.0.0.1:80/tcp\",\"per_source\":{...,\"from\":\"default\"},
             \"vip_budget\":{\"rate\":{\"per_s\":20000,\"burst\":20000},
                           \"observe\":true,\"from\":\"vip\"}}]}
  Each VIP shows what applies to it; from says whether a part is the VIP's own
  (\"vip\") or the default (\"default\"); null means no such limit.";

const RULES_HELP: &str = "\
Examples:
  lbctl rules add 192.0.2.0/24 --block
  lbctl rules add 10.20.0.0/16 --vip 10.0.0.1:80/tcp --limit 500 --observe
  lbctl rules list -o json
  lbctl rules remove 192.0.2.0/24

Rules match the client address of new flows, for one VIP or every VIP; the most
specific prefix wins, and a rule for a VIP beats a global one of the same length.";

const RULES_ADD_HELP: &str = "\
Examples:
  lbctl rules add 192.0.2.0/24 --block
  lbctl rules add 203.0.113.7 --exempt                      # a bare address is a /32
  lbctl rules add 10.20.0.0/16 --vip 10.0.0.1:80/tcp --limit 500 --burst 1000
  lbctl rules add 2001:db8::/32 --vip '[fd00::1]:443/tcp' --block --observe

--limit puts everything the CIDR matches in one bucket (a client class) instead
of per-source buckets; --exempt spares it the per-source limit (the VIP budget
applies either way). Adding a rule that exists (same CIDR and VIP) changes it in
place and keeps its counters.
--observe counts what the rule would drop and drops nothing.";

const RULES_REMOVE_HELP: &str = "\
Examples:
  lbctl rules remove 192.0.2.0/24
  lbctl rules remove 10.20.0.0/16 --vip 10.0.0.1:80/tcp";

const RULES_LIST_HELP: &str = "\
Example:
  lbctl rules list -o json

Columns:
  CIDR     the client addresses it matches
  VIP      the VIP it is for; * for every VIP
  ACTION   limit, block or exempt
  RATE     with limit: N/s burst B shared by the whole CIDR; - otherwise
  OBSERVE  yes: counted, nothing dropped; no: enforced
  HITS        new flows it matched since it was added
  DROPPED     of those, refused while it was enforced
  WOULD-DROP  of those, let through that it would have refused while it was
              in observe mode (a rule observed, then enforced, shows both)

JSON output (-o json):
  {\"rules\":[{\"cidr\":\"10.20.0.0/16\",\"vip\":\"10.0.0.1:80/tcp\",\"action\":\"limit\",
              \"rate\":{\"per_s\":500,\"burst\":500},\"observe\":false,
              \"hits\":1200,\"dropped\":35,\"would_drop\":21}]}
  vip is \"*\" for a rule on every VIP; action is limit, block or exempt; rate
  is null unless action is limit. hits, dropped and would_drop count new flows
  since the rule was added.";

const TOP_SOURCES_HELP: &str = "\
Examples:
  lbctl top-sources --vip 10.0.0.1:80/tcp
  lbctl top-sources --vip 10.0.0.1:80/tcp --limit 5 -o json

Lists the VIP's source prefixes (with its per-source prefix length) that had the
most new flows dropped, then admitted: during an incident, who is being limited.
Counters are cumulative since the source's entry appeared. The table holds the
most recently active sources (LRU): a source that went quiet can lose its entry
and start again from zero.

Counts are exact while the VIP has a per-source limit (enforced or observed),
for sources no rule matches. Otherwise (no per-source limit, or a rule matches
the prefix: a rule-limited class) a random 1 in 16 of the new flows is
recorded, counting 16, admitted or dropped (whatever dropped it: the rule, the
VIP budget): the counts are estimates (multiples of 16), marked ~, and a source
that opened N new flows is missing only if none of the N was sampled (15/16 to
the N: 4% for 50 flows, 0.0002% for 200). lbctl rules list has a rule's exact
drops. Counts from before a limit was set or removed stay mixed.

Columns: PREFIX (the source prefix), ADMITTED and DROPPED (its new flows; ~: an
estimate).

JSON output (-o json):
  {\"vip\":\"10.0.0.1:80/tcp\",\"tracked\":812,
   \"sources\":[{\"prefix\":\"198.51.100.0/24\",\"admitted\":1500,\"dropped\":9000,
                \"estimated\":false}]}
  tracked counts the VIP's entries in the source table before --limit;
  estimated says the counts come from the 1-in-16 sample.";

#[derive(Debug, Parser)]
#[command(name = "lbctl", version, about = "Control Spillway's load balancer (lbd)", after_help = LBCTL_HELP)]
pub struct Cli {
    /// lbd's API socket.
    #[arg(long, global = true, value_name = "PATH", env = "SPILLWAY_API", default_value = DEFAULT_SOCKET)]
    pub api: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Add, list and remove virtual services.
    #[command(subcommand, after_help = VIPS_HELP)]
    Vips(VipsCommand),
    /// Add, list, drain, reweight and remove the backends of a VIP.
    #[command(subcommand, after_help = BACKENDS_HELP)]
    Backends(BackendsCommand),
    /// Packet and byte counters per VIP and backend, per verdict, and what observe mode
    /// would have dropped.
    #[command(after_help = STATS_HELP)]
    Stats(OutputArgs),
    /// New-flow limits: per source prefix, and each VIP's budget.
    #[command(subcommand, after_help = RATELIMIT_HELP)]
    Ratelimit(RatelimitCommand),
    /// Rules on client CIDRs: block, exempt, or limit a client class.
    #[command(subcommand, after_help = RULES_HELP)]
    Rules(RulesCommand),
    /// The source prefixes of a VIP with the most dropped, then admitted, new flows.
    #[command(after_help = TOP_SOURCES_HELP)]
    TopSources {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(long, value_name = "VIP")]
        vip: Vip,
        /// How many prefixes to show.
        #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// A live view: per VIP and backend rates, shares and health, drops by reason.
    #[command(after_help = top::TOP_HELP)]
    Top(top::TopArgs),
    /// One flow's way through the balancer; a VIP's connection-table entries; purging them.
    #[command(subcommand, after_help = FLOWS_HELP)]
    Flows(FlowsCommand),
    /// Ephemeral-port pressure of the balancer or of a backend host.
    #[command(after_help = PORTS_HELP)]
    Ports {
        /// `lb` (the balancer) or a backend's address.
        #[arg(long, value_name = "lb|IP", default_value = "lb", value_parser = parse_host)]
        host: HostArg,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Make the desired state the one a configuration file declares: all of it, or nothing.
    #[command(after_help = APPLY_HELP)]
    Apply(ApplyArgs),
    /// What applying a configuration file would change; changes nothing.
    #[command(after_help = DIFF_HELP)]
    Diff(ApplyArgs),
    /// Print the running desired state as a configuration file.
    #[command(after_help = EXPORT_HELP)]
    Export,
    /// lbd at a glance: version, uptime, interface and XDP mode, maps, watcher, alerts.
    #[command(after_help = STATUS_HELP)]
    Status(OutputArgs),
    /// Print a shell completion script for lbctl.
    #[command(after_help = COMPLETIONS_HELP)]
    Completions(CompletionsArgs),
    /// Write the man pages of lbctl and its subcommands (section 8).
    #[command(after_help = MAN_HELP)]
    Man(ManArgs),
}

const COMPLETIONS_HELP: &str = "\
Examples:
  lbctl completions bash > /usr/local/share/bash-completion/completions/lbctl
  lbctl completions zsh > /usr/local/share/zsh/site-functions/_lbctl
  lbctl completions fish > /usr/local/share/fish/vendor_completions.d/lbctl.fish

./x install puts them there.";

const MAN_HELP: &str = "\
Example:
  lbctl man --dir /usr/local/share/man/man8    # lbctl.8, lbctl-vips.8, lbctl-vips-add.8, ...

./x install does this.";

/// `lbctl apply` and `lbctl diff`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub file: FileArg,
    /// Also remove VIPs that still have backends (their connections break); with diff,
    /// report as apply would with it.
    #[arg(long)]
    pub allow_vip_removal: bool,
    /// Also remove backends that still serve (not drained first: their connections break);
    /// with diff, report as apply would with it.
    #[arg(long)]
    pub allow_backend_removal: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `lbctl ports --host`: the balancer or a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostArg {
    Lb,
    Backend(IpAddr),
}

fn parse_host(input: &str) -> Result<HostArg, String> {
    if input == "lb" {
        return Ok(HostArg::Lb);
    }
    input.parse().map(HostArg::Backend).map_err(|_| format!("{input:?}: expected lb or a backend's IP address"))
}

#[derive(Debug, Subcommand)]
pub enum RatelimitCommand {
    /// Set the per-source new-flow limit of a VIP or of the default.
    #[command(after_help = RATELIMIT_SET_HELP)]
    Set {
        #[command(flatten)]
        scope: ScopeArgs,
        /// New flows per second from each source prefix.
        #[arg(long, value_name = "N", value_parser = parse_rate, allow_negative_numbers = true)]
        per_source: u32,
        #[command(flatten)]
        burst: BurstArg,
        /// IPv4 sources sharing one bucket: prefix length 1-32 [default: 32].
        #[arg(long, value_name = "LEN", value_parser = clap::value_parser!(u8).range(1..=32), allow_negative_numbers = true)]
        source_prefix_v4: Option<u8>,
        /// IPv6 sources sharing one bucket: prefix length 1-128 [default: 64].
        #[arg(long, value_name = "LEN", value_parser = clap::value_parser!(u8).range(1..=128), allow_negative_numbers = true)]
        source_prefix_v6: Option<u8>,
        /// Count what would be dropped, drop nothing.
        #[arg(long)]
        observe: bool,
    },
    /// Set the new-flow budget of a VIP (or of every VIP, with --default).
    #[command(after_help = RATELIMIT_BUDGET_HELP)]
    Budget {
        #[command(flatten)]
        scope: ScopeArgs,
        /// New flows per second the VIP admits.
        #[arg(long, value_name = "N", value_parser = parse_rate, allow_negative_numbers = true)]
        new_flows: u32,
        #[command(flatten)]
        burst: BurstArg,
        /// Count what would be dropped, drop nothing.
        #[arg(long)]
        observe: bool,
    },
    /// Remove the per-source limit, the budget, or both, of a VIP or of the default.
    #[command(after_help = RATELIMIT_CLEAR_HELP)]
    Clear {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Only the per-source limit.
        #[arg(long, conflicts_with = "budget")]
        per_source: bool,
        /// Only the budget.
        #[arg(long)]
        budget: bool,
    },
    /// The default limits and what applies to every VIP.
    #[command(after_help = RATELIMIT_LIST_HELP)]
    List(OutputArgs),
}

/// `--vip <VIP>` or `--default`, exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ScopeArgs {
    /// The VIP whose limits to change.
    #[arg(long, value_name = "VIP")]
    pub vip: Option<Vip>,
    /// The default limits, for every VIP without its own.
    #[arg(long)]
    pub default: bool,
}

impl ScopeArgs {
    pub fn scope(&self) -> Scope {
        match self.vip {
            Some(vip) => Scope::Vip(vip),
            None => Scope::Default,
        }
    }
}

#[derive(Debug, Args)]
pub struct BurstArg {
    /// Extra new flows admitted at once after a quiet period [default: one second's worth].
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u32), allow_negative_numbers = true)]
    pub burst: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Add a rule, or change the rule of the same CIDR and VIP.
    #[command(after_help = RULES_ADD_HELP)]
    Add {
        /// Client addresses, e.g. 10.0.0.0/8, 2001:db8::/32 or one address.
        #[arg(value_name = "CIDR")]
        cidr: Cidr,
        /// Only new flows to this VIP [default: every VIP].
        #[arg(long, value_name = "VIP")]
        vip: Option<Vip>,
        #[command(flatten)]
        action: RuleActionArgs,
        /// With --limit: extra new flows admitted at once [default: one second's worth].
        #[arg(long, value_name = "B", conflicts_with_all = ["block", "exempt"], value_parser = clap::value_parser!(u32), allow_negative_numbers = true)]
        burst: Option<u32>,
        /// Count what would be dropped, drop nothing.
        #[arg(long)]
        observe: bool,
    },
    /// Remove a rule.
    #[command(after_help = RULES_REMOVE_HELP)]
    Remove {
        /// The rule's client addresses, as it was added.
        #[arg(value_name = "CIDR")]
        cidr: Cidr,
        /// The VIP the rule is for [default: the rule on every VIP].
        #[arg(long, value_name = "VIP")]
        vip: Option<Vip>,
    },
    /// List the rules with their counters.
    #[command(after_help = RULES_LIST_HELP)]
    List(OutputArgs),
}

/// `--limit <N>`, `--block` or `--exempt`, exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct RuleActionArgs {
    /// Admit at most N new flows per second from everything the CIDR matches, together.
    #[arg(long, value_name = "N", value_parser = parse_rate, allow_negative_numbers = true)]
    pub limit: Option<u32>,
    /// Drop new flows from the CIDR.
    #[arg(long)]
    pub block: bool,
    /// Spare the CIDR the per-source limit (the VIP budget still applies).
    #[arg(long)]
    pub exempt: bool,
}

impl RuleActionArgs {
    pub fn kind(&self) -> RuleActionKind {
        match (self.limit, self.block) {
            (Some(_), _) => RuleActionKind::Limit,
            (None, true) => RuleActionKind::Block,
            (None, false) => RuleActionKind::Exempt,
        }
    }
}

/// `lbctl vips add --quic`: a QUIC VIP and its QUIC-LB configuration.
#[derive(Debug, clap::Args)]
pub struct QuicArgs {
    /// A QUIC VIP (UDP): short-header packets go to the backend whose server id their
    /// connection id carries, whatever their source address and port.
    #[arg(long)]
    quic: bool,
    /// QUIC-LB config id of the servers' connection ids, 0..=6.
    #[arg(long, value_name = "ID", requires = "quic", default_value_t = 0)]
    quic_config_id: u8,
    /// Octets of server id in them (each backend's: the last octets of its address).
    #[arg(long, value_name = "N", requires = "quic", default_value_t = DEFAULT_SERVER_ID_LEN)]
    quic_server_id_len: u8,
    /// Octets of nonce in them, at least 4.
    #[arg(long, value_name = "N", requires = "quic", default_value_t = DEFAULT_NONCE_LEN)]
    quic_nonce_len: u8,
    /// The servers write the id's length into its first octet.
    #[arg(long, requires = "quic")]
    quic_self_len: bool,
    /// The servers encrypt their ids (QUIC-LB §5.4) with the key in FILE: 32 hexadecimal
    /// digits, readable by root alone (lbd refuses a file group or others may read or
    /// write). lbd reads it; only the path is kept, shown and exported, never the key.
    #[arg(long, value_name = "FILE", requires = "quic")]
    quic_key_file: Option<std::path::PathBuf>,
}

/// A second QUIC-LB config id (`lbctl vips quic-next`).
#[derive(Debug, Args)]
pub struct QuicNextArgs {
    /// Its config id, 0..=6: another than the current one.
    #[arg(long, value_name = "ID")]
    quic_config_id: u8,
    /// Octets of server id: the current config id's (the backends keep their server ids).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SERVER_ID_LEN)]
    quic_server_id_len: u8,
    /// Octets of nonce, at least 4.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_NONCE_LEN)]
    quic_nonce_len: u8,
    /// The servers write the id's length into its first octet.
    #[arg(long)]
    quic_self_len: bool,
    /// The servers encrypt their ids of this config id with the key in FILE (32
    /// hexadecimal digits, root's alone).
    #[arg(long, value_name = "FILE")]
    quic_key_file: Option<std::path::PathBuf>,
}

impl QuicNextArgs {
    fn config(&self) -> QuicConfig {
        QuicArgs {
            quic: true,
            quic_config_id: self.quic_config_id,
            quic_server_id_len: self.quic_server_id_len,
            quic_nonce_len: self.quic_nonce_len,
            quic_self_len: self.quic_self_len,
            quic_key_file: self.quic_key_file.clone(),
        }
        .config()
        .unwrap_or_default()
    }
}

impl QuicArgs {
    fn config(&self) -> Option<QuicConfig> {
        self.quic.then_some(QuicConfig {
            config_id: self.quic_config_id,
            server_id_len: self.quic_server_id_len,
            nonce_len: self.quic_nonce_len,
            self_len: self.quic_self_len,
            // lbd reads it from its own working directory: the path it gets is absolute.
            key_file: self.quic_key_file.as_deref().map(|f| std::path::absolute(f).unwrap_or_else(|_| f.to_path_buf())),
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum VipsCommand {
    /// Add a VIP (no backends yet: its packets are dropped until one is added).
    #[command(after_help = VIPS_ADD_HELP)]
    Add {
        /// The VIP, e.g. 10.0.0.1:80/tcp (port 0: every port).
        #[arg(value_name = "VIP")]
        vip: Vip,
        /// Maglev table size: a prime from 13 to 65537 [default: 65537].
        #[arg(long, value_name = "PRIME")]
        ring_size: Option<u32>,
        /// Also on an address of the balancer itself, whose own traffic to that port the VIP
        /// then takes (kept: allow_local_address in an export).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        quic: QuicArgs,
        /// How its backends are tunnelled to (a backend's --encap overrides it).
        #[arg(long, value_enum, value_name = "ENCAP", default_value_t = Encap::Ipip)]
        encap: Encap,
        /// What Maglev hashes to place new flows: the 5-tuple, or the client's source address
        /// (client affinity: every connection of a client to one backend).
        #[arg(long, value_enum, value_name = "HASH", default_value_t = HashMode::FiveTuple)]
        hash: HashMode,
        /// With --hash source: hash the client address's first N bits only (IPv4 1-32, IPv6
        /// 1-128) [default: the whole address].
        #[arg(long, value_name = "N")]
        source_prefix: Option<u8>,
    },
    /// Change how a VIP's backends are tunnelled to (those without their own --encap).
    #[command(after_help = VIPS_ENCAP_HELP)]
    Encap {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(value_name = "VIP")]
        vip: Vip,
        /// How its backends are tunnelled to from now on (a backend's --encap overrides it).
        #[arg(value_enum, value_name = "ENCAP")]
        encap: Encap,
    },
    /// List the VIPs.
    #[command(after_help = VIPS_LIST_HELP)]
    List(OutputArgs),
    /// Remove a VIP and all its backends.
    #[command(after_help = VIPS_REMOVE_HELP)]
    Remove {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(value_name = "VIP")]
        vip: Vip,
        /// Also a VIP that still has backends (their connections break).
        #[arg(long)]
        force: bool,
    },
    /// Rotate a QUIC VIP's key: a second config id beside its current one, with its own
    /// key file (both are decoded until `vips quic-retire`). Give the servers the new
    /// config id once the balancer has it; retire the old one when its connections are gone.
    #[command(after_help = VIPS_QUIC_NEXT_HELP)]
    QuicNext {
        /// The QUIC VIP, e.g. 10.0.0.3:443/udp.
        #[arg(value_name = "VIP")]
        vip: Vip,
        #[command(flatten)]
        next: QuicNextArgs,
    },
    /// End a key rotation: the second config id becomes the VIP's only one, and ids of the
    /// old one go by the 5-tuple from now on.
    #[command(after_help = VIPS_QUIC_NEXT_HELP)]
    QuicRetire {
        /// The QUIC VIP, e.g. 10.0.0.3:443/udp.
        #[arg(value_name = "VIP")]
        vip: Vip,
    },
    /// Change how a VIP's backends are health-checked.
    #[command(after_help = VIPS_HEALTH_HELP)]
    Health {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(value_name = "VIP")]
        vip: Vip,
        #[command(flatten)]
        health: HealthArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum BackendsCommand {
    /// Add a backend to a VIP.
    #[command(after_help = BACKENDS_ADD_HELP)]
    Add {
        #[command(flatten)]
        target: Target,
        /// Share of new flows relative to the VIP's other backends.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_WEIGHT, value_parser = weight())]
        weight: u32,
        #[command(flatten)]
        options: BackendOptionArgs,
    },
    /// Replace a backend's zone, capacity, spare capacity and probe target.
    #[command(after_help = BACKENDS_OPTIONS_HELP)]
    Options {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        options: BackendOptionArgs,
    },
    /// List a VIP's backends.
    #[command(after_help = BACKENDS_LIST_HELP)]
    List {
        /// The VIP, e.g. 10.0.0.1:80/tcp.
        #[arg(long, value_name = "VIP")]
        vip: Vip,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Remove a backend from a VIP.
    #[command(after_help = BACKENDS_REMOVE_HELP)]
    Remove {
        #[command(flatten)]
        target: Target,
    },
    /// Stop sending new flows to a backend; its existing flows stay.
    #[command(after_help = BACKENDS_DRAIN_HELP)]
    Drain {
        #[command(flatten)]
        target: Target,
        /// Remove the backend after this long: 90s, 15m, 2h.
        #[arg(long, value_name = "DURATION", value_parser = parse_deadline)]
        deadline: Option<u64>,
        /// Also the VIP's last active backend (new connections to the VIP then fail).
        #[arg(long)]
        force: bool,
    },
    /// Change a backend's weight (also undoes a drain).
    #[command(after_help = BACKENDS_SET_WEIGHT_HELP)]
    SetWeight {
        #[command(flatten)]
        target: Target,
        /// The new weight: its share of new flows relative to the VIP's other backends,
        /// 1 to 1000000 (to stop new flows, drain it).
        #[arg(value_name = "N", value_parser = weight())]
        weight: u32,
    },
}

/// A backend of a VIP.
#[derive(Debug, Args)]
pub struct Target {
    /// The VIP, e.g. 10.0.0.1:80/tcp.
    #[arg(long, value_name = "VIP")]
    pub vip: Vip,
    /// The backend's address.
    #[arg(value_name = "IP")]
    pub backend: IpAddr,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// JSON with stable field names (see each command's help).
    Json,
}

fn weight() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(MAX_WEIGHT))
}

/// New flows per second: 1..=MAX_RATE_PER_S; zero and negative rates are refused.
fn parse_rate(input: &str) -> Result<u32, String> {
    let n: i64 = input.trim().parse().map_err(|_| format!("expected a number of new flows per second (1..={MAX_RATE_PER_S})"))?;
    if n < 1 {
        return Err(format!("a rate must be at least 1 new flow per second (1..={MAX_RATE_PER_S}); to lift a limit, clear or remove it"));
    }
    u32::try_from(n).ok().filter(|n| *n <= MAX_RATE_PER_S).ok_or_else(|| format!("at most {MAX_RATE_PER_S} new flows per second"))
}

impl Command {
    /// The API request this command sends (`None`: it needs no lbd); options that do not
    /// fit together are refused.
    pub fn request(&self) -> Result<Option<Request>, CliError> {
        Ok(Some(match self {
            Command::Vips(VipsCommand::Add { vip, ring_size, force, quic, encap, hash, source_prefix }) => {
                spillway_model::check_hash(vip, *hash, *source_prefix).map_err(|e| CliError::BadOption(e.to_string()))?;
                Request::AddVip {
                    vip: *vip,
                    ring_size: *ring_size,
                    force: *force,
                    quic: quic.config(),
                    encap: *encap,
                    hash: *hash,
                    source_prefix: *source_prefix,
                }
            }
            Command::Vips(VipsCommand::List(_)) => Request::ListVips,
            Command::Vips(VipsCommand::Remove { vip, force }) => Request::RemoveVip { vip: *vip, force: *force },
            Command::Vips(VipsCommand::Encap { vip, encap }) => Request::SetVipEncap { vip: *vip, encap: *encap },
            Command::Vips(VipsCommand::QuicNext { vip, next }) => Request::SetQuicNext { vip: *vip, next: Some(next.config()) },
            Command::Vips(VipsCommand::QuicRetire { vip }) => Request::RetireQuic { vip: *vip },
            Command::Vips(VipsCommand::Health { vip, health }) => Request::SetHealth {
                vip: *vip,
                probe: health.probe_spec()?,
                probe_path: health.probe_path,
                policy: health.policy(),
                reset: health.reset,
            },
            Command::Backends(BackendsCommand::Add { target, weight, options }) => {
                Request::AddBackend { vip: target.vip, backend: target.backend, weight: Some(*weight), options: options.options() }
            }
            Command::Backends(BackendsCommand::Options { target, options }) => {
                Request::SetBackendOptions { vip: target.vip, backend: target.backend, options: options.options() }
            }
            Command::Backends(BackendsCommand::List { vip, .. }) => Request::ListBackends { vip: *vip },
            Command::Backends(BackendsCommand::Remove { target }) => Request::RemoveBackend { vip: target.vip, backend: target.backend },
            Command::Backends(BackendsCommand::Drain { target, deadline, force }) => {
                Request::DrainBackend { vip: target.vip, backend: target.backend, deadline_s: *deadline, force: *force }
            }
            Command::Backends(BackendsCommand::SetWeight { target, weight }) => {
                Request::SetWeight { vip: target.vip, backend: target.backend, weight: *weight }
            }
            Command::Stats(_) => Request::Stats,
            Command::Ratelimit(RatelimitCommand::Set { scope, per_source, burst, source_prefix_v4, source_prefix_v6, observe }) => {
                Request::SetRateLimit {
                    scope: scope.scope(),
                    per_s: *per_source,
                    burst: burst.burst,
                    source_prefix_v4: *source_prefix_v4,
                    source_prefix_v6: *source_prefix_v6,
                    observe: *observe,
                }
            }
            Command::Ratelimit(RatelimitCommand::Budget { scope, new_flows, burst, observe }) => {
                Request::SetBudget { scope: scope.scope(), per_s: *new_flows, burst: burst.burst, observe: *observe }
            }
            Command::Ratelimit(RatelimitCommand::Clear { scope, per_source, budget }) => {
                let part = match (per_source, budget) {
                    (true, _) => LimitPart::PerSource,
                    (false, true) => LimitPart::Budget,
                    (false, false) => LimitPart::All,
                };
                Request::ClearRateLimit { scope: scope.scope(), part }
            }
            Command::Ratelimit(RatelimitCommand::List(_)) => Request::ListRateLimits,
            Command::Rules(RulesCommand::Add { cidr, vip, action, burst, observe }) => {
                Request::SetRule { cidr: *cidr, vip: *vip, action: action.kind(), per_s: action.limit, burst: *burst, observe: *observe }
            }
            Command::Rules(RulesCommand::Remove { cidr, vip }) => Request::RemoveRule { cidr: *cidr, vip: *vip },
            Command::Rules(RulesCommand::List(_)) => Request::ListRules,
            Command::TopSources { vip, limit, .. } => Request::TopSources { vip: *vip, limit: Some(*limit) },
            Command::Top(_) => Request::Sample,
            Command::Flows(FlowsCommand::Get { vip, client, port, .. }) => Request::FlowGet { vip: *vip, client: *client, port: *port },
            Command::Flows(FlowsCommand::List { vip, backend, limit, .. }) => {
                Request::FlowList { vip: *vip, backend: *backend, limit: Some(*limit) }
            }
            Command::Flows(FlowsCommand::Purge { backend }) => Request::FlowPurge { backend: *backend },
            Command::Ports { host, .. } => Request::Ports {
                host: match host {
                    HostArg::Lb => None,
                    HostArg::Backend(addr) => Some(*addr),
                },
            },
            Command::Apply(args) | Command::Diff(args) => {
                let (config, source) = args.file.read()?;
                Request::Apply {
                    config,
                    source,
                    dry_run: matches!(self, Command::Diff(_)),
                    allow_vip_removal: args.allow_vip_removal,
                    allow_backend_removal: args.allow_backend_removal,
                }
            }
            Command::Export => Request::Export,
            Command::Status(_) => Request::Status,
            Command::Completions(_) | Command::Man(_) => return Ok(None),
        }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("writing the output")]
    Output(#[from] io::Error),
    #[error("lbd sent a reply that does not fit the command; are lbd and lbctl the same version?")]
    UnexpectedReply,
    #[error("{0}")]
    BadOption(String),
}

/// How a command that succeeded ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// `lbctl diff` found changes (exit status 1).
    Differs,
    /// `lbctl diff` found changes that `apply` would refuse as they are (exit status 3).
    Refused,
    /// `lbctl ports` has no report for the host (its error is printed; exit status 1).
    NoReport,
}

/// Sends the command's request to lbd and writes the answer to `out` (`top` repeats it).
pub fn run(cli: &Cli, out: &mut dyn io::Write) -> Result<Outcome, CliError> {
    match &cli.command {
        Command::Top(args) => {
            use std::io::IsTerminal;
            top::run(&cli.api, args, io::stdout().is_terminal(), out)?;
        }
        Command::Completions(c) => docs::completions(Cli::command(), c.shell, out),
        Command::Man(m) => {
            docs::man_pages(Cli::command(), &m.dir)?;
        }
        command => {
            let Some(request) = command.request()? else { return Err(CliError::UnexpectedReply) };
            return render::reply(command, client::call(&cli.api, &request)?, out);
        }
    }
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests;
