//! `leasehold publish --file F`: many commands at once (a migration, a scripted load), read from a file of one JSON
//! command a line and sent in batches, through the gateway (`POST /v1/commands/batch`) or straight to JetStream
//! (`--nats`, `Log::publish_commands`). Each command keeps its own id, so sending the file again is safe: what was
//! stored is answered as a duplicate, never stored twice.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use leasehold_log::Log;
use leasehold_schemas::{CommandClass, Envelope, codec};
use serde::Serialize;

use crate::GlobalArgs;
use crate::client::{BatchItem, BatchRefusal};
use crate::nats_args::NatsArgs;
use crate::output::{self, OutputFormat};
use crate::produce::{self, Transport};

/// `leasehold publish`
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("nats", |a| a.help(
        "Publish straight to NATS JetStream at this URL (comma-separated for several servers) instead of through \
         the gateway. Credentials go in --creds or --user/--password, never in the URL"
    )),
    mut_arg("replicas", |a| a.hide(true)),
)]
pub(crate) struct PublishArgs {
    /// The commands: one JSON command a line, each what `POST /v1/commands` takes (NDJSON); `-` reads stdin. Blank
    /// lines and lines starting with `#` are skipped. Each command keeps its own issuer unless --issuer is given (a
    /// gateway with tokens records your token's principal instead).
    #[arg(long, value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// Send only the commands from this line of the file on (every line is still checked first): to send the rest of
    /// a publish that was interrupted, as its summary says.
    #[arg(long, value_name = "LINE", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) from_line: Option<u64>,
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
}

/// Some commands were sent and may have been stored, without an answer that says so: exit status 3, as a producer
/// command whose outcome is unknown. Sending the file again is safe.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SomeUnknown(String);

/// One command of the file and its line.
#[derive(Debug)]
struct Line {
    number: usize,
    envelope: Envelope,
}

/// What `--output json` prints for one command.
#[derive(Debug, Serialize)]
struct Printed<'a> {
    line: usize,
    command_id: Option<&'a str>,
    /// `published`, `refused` or `unknown` (it may have been stored: send it again).
    status: &'static str,
    command_seq: Option<u64>,
    duplicate: bool,
    status_code: Option<u16>,
    error: Option<&'a str>,
}

pub(crate) async fn run(args: PublishArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading the commands from stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    // `--as-principal` makes every command its principal's (a bound producer sends as it only).
    let issuer = match (&global.issuer, &global.as_principal) {
        (None, None) => None,
        _ => Some(produce::sender(global)?),
    };
    let mut lines =
        parse(&text, issuer.as_ref()).with_context(|| format!("{}: nothing was sent", args.file.display()))?;
    if let Some(from) = args.from_line {
        lines.retain(|line| line.number as u64 >= from);
        if lines.is_empty() {
            bail!("{}: no commands on line {from} or after it: nothing was sent", args.file.display());
        }
    }
    let transport = produce::transport(global, &args.nats).await?;
    // A bound producer's line the writer would dead-letter (an operator's command) is refused before any is sent.
    if let Some(principal) = transport.principal() {
        let bad: Vec<String> = lines
            .iter()
            .filter_map(|line| {
                leasehold_client::publish_subject(&line.envelope, Some(principal))
                    .err()
                    .map(|e| format!("line {}: {}", line.number, leasehold_schemas::text::shown(&e)))
            })
            .collect();
        if !bad.is_empty() {
            return Err(output::ShownError(format!(
                "{}: {} line(s) a producer bound to {principal} may not send; nothing was sent:\n  {}",
                args.file.display(),
                bad.len(),
                bad.join("\n  ")
            ))
            .into());
        }
    }
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut answers = Vec::with_capacity(lines.len());
    // In batches the size of the gateway's, so that an interruption cuts between two (or in one: that one's commands
    // may have been stored).
    for chunk in lines.chunks(leasehold_schemas::api::MAX_BATCH_COMMANDS) {
        let envelopes: Vec<Envelope> = chunk.iter().map(|line| line.envelope.clone()).collect();
        let sent = tokio::select! {
            _ = &mut interrupted => {
                let stop = Stop { why: "interrupted (Ctrl-C)".to_owned(), in_flight: chunk.len() };
                return interrupted_report(&lines, &answers, &stop, &args, global);
            }
            sent = send(&transport, &envelopes) => sent,
        };
        match sent {
            Ok(items) => {
                // Nothing of the batch answered: the gateway or the log went away. What comes after is not sent.
                let lost = items.iter().all(|item| matches!(item, BatchItem::Refused(r) if r.status_code >= 500));
                let why = match items.first() {
                    Some(BatchItem::Refused(refusal)) if lost => Some(refusal.error.clone()),
                    _ => None,
                };
                answers.extend(items);
                if let Some(why) = why.filter(|_| answers.len() < lines.len()) {
                    let stop = Stop { why: format!("no command of a batch was answered: {why}"), in_flight: 0 };
                    return interrupted_report(&lines, &answers, &stop, &args, global);
                }
            }
            // Before any answer: as before, nothing was sent.
            Err(e) if answers.is_empty() => return Err(e),
            // A later batch that could not be sent at all (no connection): it and the rest are not sent.
            Err(e) => {
                let stop = Stop { why: format!("the connection was lost: {e:#}"), in_flight: 0 };
                return interrupted_report(&lines, &answers, &stop, &args, global);
            }
        }
    }
    report(&lines, &answers, global.output)
}

/// Sends one batch of commands through `transport`.
async fn send(transport: &Transport, envelopes: &[Envelope]) -> anyhow::Result<Vec<BatchItem>> {
    match transport {
        Transport::Gateway(gateway) => Ok(gateway.submit_many(envelopes).await?),
        Transport::Nats(log) => publish_to_log(log, envelopes, None).await,
        Transport::BoundNats { log, principal } => publish_to_log(log, envelopes, Some(principal)).await,
    }
}

/// Why a publish stopped before it sent every command, and how many it was sending then (they may have been
/// stored).
#[derive(Debug)]
struct Stop {
    why: String,
    in_flight: usize,
}

/// What `--output json` prints for a publish that stopped half-way.
#[derive(Debug, Serialize)]
struct Interrupted<'a> {
    interrupted: &'a str,
    commands: usize,
    sent: usize,
    stored: usize,
    duplicates: usize,
    refused: usize,
    unknown: usize,
    not_sent: usize,
    resend_from_line: Option<usize>,
    resend: Option<String>,
    answers: Vec<Printed<'a>>,
}

/// A publish that stopped half-way (Ctrl-C, the connection lost): one summary — sent, stored, refused, may not be
/// stored, not sent — and the command line that sends the rest (from the first command that may not have been stored:
/// sending one stored already again is answered as a duplicate). Exit status 3.
fn interrupted_report(
    lines: &[Line],
    answers: &[BatchItem],
    stop: &Stop,
    args: &PublishArgs,
    global: &GlobalArgs,
) -> anyhow::Result<()> {
    let printed = printed(lines, answers);
    let stored = printed.iter().filter(|p| p.status == "published").count();
    let duplicates = printed.iter().filter(|p| p.duplicate).count();
    let refused: Vec<usize> = printed.iter().filter(|p| p.status == "refused").map(|p| p.line).collect();
    let unknown_answered: Vec<usize> = printed.iter().filter(|p| p.status == "unknown").map(|p| p.line).collect();
    let n_unknown = unknown_answered.len() + stop.in_flight;
    let sent = answers.len() + stop.in_flight;
    let not_sent = lines.len() - sent;
    // The first command not known to be stored or refused: every one before it was answered.
    let resend_from = unknown_answered.first().copied().or_else(|| lines.get(answers.len()).map(|l| l.number));
    let resend = resend_from.map(|line| resend_command(args, global, line));
    let what = format!(
        "publish stopped, {}: of {} command(s), {sent} sent: {stored} stored ({duplicates} of them duplicates of          commands stored before), {} refused{}, {n_unknown} may not have been stored{}; {not_sent} not sent",
        stop.why,
        lines.len(),
        refused.len(),
        if refused.is_empty() { String::new() } else { format!(" (line(s) {})", short_list(&refused)) },
        if stop.in_flight > 0 { " (the batch being sent when it stopped)" } else { "" },
    );
    if global.output == OutputFormat::Json {
        let value = Interrupted {
            interrupted: &stop.why,
            commands: lines.len(),
            sent,
            stored,
            duplicates,
            refused: refused.len(),
            unknown: n_unknown,
            not_sent,
            resend_from_line: resend_from,
            resend: resend.clone(),
            answers: printed,
        };
        output::emit(&output::json(&value)?);
    }
    let next = match &resend {
        Some(resend) => format!(
            "\nsend the rest (a command stored already is answered as a duplicate, never stored twice):\n  {resend}"
        ),
        None => String::new(),
    };
    Err(SomeUnknown(format!("{}{next}", leasehold_schemas::text::shown(&what))).into())
}

/// The command line that sends the commands of `args.file` from line `line` on, as this one did.
fn resend_command(args: &PublishArgs, global: &GlobalArgs, line: usize) -> String {
    let mut words = vec!["leasehold".to_owned()];
    if global.server != crate::client::DEFAULT_SERVER && args.nats.nats.is_none() {
        words.extend(["--server".to_owned(), produce::shell_word(&global.server)]);
    }
    words.extend([
        "publish".to_owned(),
        "--file".to_owned(),
        produce::shell_word(&args.file.display().to_string()),
        "--from-line".to_owned(),
        line.to_string(),
    ]);
    if let Some(url) = &args.nats.nats {
        words.extend(["--nats".to_owned(), produce::shell_word(url)]);
        if let Some(creds) = &args.nats.creds {
            words.extend(["--creds".to_owned(), produce::shell_word(&creds.display().to_string())]);
        }
        if let Some(seed) = &args.nats.nkey_seed {
            words.extend(["--nkey-seed".to_owned(), produce::shell_word(&seed.display().to_string())]);
        }
        if let Some(prefix) = &args.nats.inbox_prefix {
            words.extend(["--inbox-prefix".to_owned(), produce::shell_word(prefix)]);
        }
        if let Some(user) = &args.nats.user {
            words.extend([
                "--user".to_owned(),
                produce::shell_word(user),
                "--password".to_owned(),
                "PASSWORD".to_owned(),
            ]);
        }
    }
    if let Some(issuer) = &global.issuer {
        words.extend(["--issuer".to_owned(), produce::shell_word(issuer)]);
    }
    if let Some(principal) = &global.as_principal {
        words.extend(["--as-principal".to_owned(), produce::shell_word(principal)]);
    }
    words.join(" ")
}

/// Line numbers, the first ten of them and how many more.
fn short_list(numbers: &[usize]) -> String {
    match numbers.len() {
        0..=10 => list(numbers),
        n => format!("{} and {} more", list(&numbers[..10]), n - 10),
    }
}

/// The commands of `text`, one a line (blank lines and `#` comments skipped), each decoded as strictly as the gateway
/// decodes it and of class `op`; `issuer`, when given, replaces each one's. Every bad line is named, with its number.
fn parse(text: &str, issuer: Option<&leasehold_schemas::Issuer>) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let number = idx + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match codec::command_from_json(line.as_bytes()) {
            Ok(envelope) if envelope.class != CommandClass::Op => bad.push(format!(
                "line {number}: {} is {} {} command; publish takes op commands only (agents and sweepers send \
                 theirs on NATS with credentials that allow it)",
                envelope.type_name(),
                if envelope.class == CommandClass::Agent { "an" } else { "a" },
                envelope.class
            )),
            Ok(mut envelope) => {
                if let Some(issuer) = issuer {
                    envelope.issuer = issuer.clone();
                }
                lines.push(Line { number, envelope });
            }
            // The codec's message quotes the line (a field name as it was written): escaped for display here, since
            // the list of bad lines is one error of several lines, printed as it is (`output::ShownError`).
            Err(e) => bad.push(format!("line {number}: {}", leasehold_schemas::text::shown(&e))),
        }
    }
    if !bad.is_empty() {
        return Err(output::ShownError(format!(
            "{} bad line(s), each in the JSON form POST /v1/commands takes:\n  {}",
            bad.len(),
            bad.join("\n  ")
        ))
        .into());
    }
    if lines.is_empty() {
        bail!("no commands in it: one JSON command a line");
    }
    Ok(lines)
}

/// Publishes `envelopes` to the log together (`Log::publish_commands`: atomic batches on JetStream), and answers
/// each as the gateway's batch endpoint would ([`leasehold_log::settle_publish`]): a duplicate must be this very
/// command (409 otherwise), a refusal of the log is a 400, a publish the log could not answer a 503 (it may have been
/// stored). An error only when no command could be published at all (the log unreachable): nothing was stored.
async fn publish_to_log<L: Log>(
    log: &L,
    envelopes: &[Envelope],
    bound: Option<&leasehold_schemas::Issuer>,
) -> anyhow::Result<Vec<BatchItem>> {
    use leasehold_log::NotStored;
    let mut commands = Vec::with_capacity(envelopes.len());
    for envelope in envelopes {
        let payload = codec::encode_command(envelope).with_context(|| format!("encoding {}", envelope.command_id))?;
        commands.push(leasehold_log::Publish {
            subject: leasehold_client::publish_subject(envelope, bound)?,
            msg_id: envelope.command_id.to_string(),
            payload: payload.into(),
        });
    }
    let published = log.publish_commands(&commands).await;
    if let Some(Err(e @ leasehold_log::Error::Unavailable(_))) = published.first()
        && published.iter().all(|answer| matches!(answer, Err(leasehold_log::Error::Unavailable(_))))
    {
        bail!("publishing to the log: {e}");
    }
    let mut answers = Vec::with_capacity(envelopes.len());
    for (index, (envelope, answer)) in envelopes.iter().zip(published).enumerate() {
        let id = envelope.command_id.to_string();
        let refused = |status_code: u16, error: String| {
            BatchItem::Refused(BatchRefusal { index, command_id: Some(id.clone()), error, status_code })
        };
        answers.push(match leasehold_log::settle_publish(log, answer, envelope, None).await {
            Ok(published) => BatchItem::Published(crate::client::CommandStatus {
                command_id: id.clone(),
                status: "published".to_owned(),
                command_seq: Some(published.seq),
                duplicate: published.duplicate,
                rejection: None,
                outcomes: Vec::new(),
                dead_letter: None,
            }),
            Err(NotStored::Refused(e)) => refused(400, e.to_string()),
            Err(NotStored::OtherCommand(why)) => refused(409, why),
            Err(NotStored::Unanswered(e)) => refused(503, format!("{e}; it may have been stored")),
            Err(NotStored::Unchecked(e)) => {
                refused(503, format!("stored under an id already used; the log cannot say by what: {e}"))
            }
        });
    }
    Ok(answers)
}

/// Prints one line (table) or one JSON object (json, in one array) per command, in the file's order; then fails
/// when any was refused (exit 1) or may not have been stored (exit 3), naming their lines.
fn report(lines: &[Line], answers: &[BatchItem], format: OutputFormat) -> anyhow::Result<()> {
    let printed = printed(lines, answers);
    let refused: Vec<usize> = printed.iter().filter(|p| p.status == "refused").map(|p| p.line).collect();
    let unknown: Vec<usize> = printed.iter().filter(|p| p.status == "unknown").map(|p| p.line).collect();
    report_printed(lines, printed, &refused, &unknown, format)
}

/// What to print of each answered command, in the file's order.
fn printed<'a>(lines: &[Line], answers: &'a [BatchItem]) -> Vec<Printed<'a>> {
    let mut printed = Vec::with_capacity(lines.len());
    for (line, answer) in lines.iter().zip(answers) {
        printed.push(match answer {
            BatchItem::Published(status) => Printed {
                line: line.number,
                command_id: Some(&status.command_id),
                status: "published",
                command_seq: status.command_seq,
                duplicate: status.duplicate,
                status_code: None,
                error: None,
            },
            BatchItem::Refused(refusal) => {
                let is_unknown = refusal.status_code >= 500;
                Printed {
                    line: line.number,
                    command_id: refusal.command_id.as_deref(),
                    status: if is_unknown { "unknown" } else { "refused" },
                    command_seq: None,
                    duplicate: false,
                    status_code: Some(refusal.status_code),
                    error: Some(&refusal.error),
                }
            }
        });
    }
    printed
}

fn report_printed(
    lines: &[Line],
    printed: Vec<Printed<'_>>,
    refused: &[usize],
    unknown: &[usize],
    format: OutputFormat,
) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => output::emit(&output::json(&printed)?),
        OutputFormat::Table => {
            let mut text = String::new();
            for item in &printed {
                let id = item.command_id.unwrap_or("-");
                let line = match (item.command_seq, item.error) {
                    (Some(seq), _) if item.duplicate => format!("{id}  {seq}  duplicate"),
                    (Some(seq), _) => format!("{id}  {seq}"),
                    (None, error) => format!(
                        "{id}  {} {} (line {}): {}",
                        item.status,
                        output::opt(item.status_code),
                        item.line,
                        error.unwrap_or_default()
                    ),
                };
                // The gateway's refusals echo the command's text: the line is shown escaped.
                text.push_str(&leasehold_schemas::text::escape_for_display(&line));
                text.push('\n');
            }
            output::emit(&text);
        }
    }
    let n_duplicates = printed.iter().filter(|p| p.duplicate).count();
    eprintln!(
        "{} command(s): {} published ({n_duplicates} of them duplicates of commands stored before), {} refused, {} \
         unknown",
        lines.len(),
        lines.len() - refused.len() - unknown.len(),
        refused.len(),
        unknown.len()
    );
    if !refused.is_empty() {
        bail!("{} command(s) refused, on line(s) {}: nothing was stored for them", refused.len(), list(refused));
    }
    if !unknown.is_empty() {
        return Err(SomeUnknown(format!(
            "{} command(s) may not have been stored, on line(s) {}: send the file again (a command stored already is \
             answered as a duplicate, never stored twice)",
            unknown.len(),
            list(unknown)
        ))
        .into());
    }
    Ok(())
}

fn list(numbers: &[usize]) -> String {
    numbers.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use leasehold_log::embedded::{Embedded, system_clock};
    use leasehold_schemas::command::{Allocate, Heartbeat};
    use leasehold_schemas::{AgentName, CommandId, Issuer, Position, ResourceId, Timestamp};

    use super::*;

    fn allocate(id: CommandId) -> Envelope {
        let agent = AgentName::new("w1").unwrap();
        let body = Allocate::new(agent, ResourceId::generate(), "dir", 1);
        Envelope::new(id, Issuer::new("op:script").unwrap(), Timestamp(1), body)
    }

    fn json(envelope: &Envelope) -> String {
        codec::command_to_json(envelope).unwrap()
    }

    #[test]
    fn lines_are_commands_and_every_bad_one_is_named_by_its_number() {
        let (a, b) = (allocate(CommandId::generate()), allocate(CommandId::generate()));
        let text = format!("# a comment\n\n{}\n  {}  \r\n", json(&a), json(&b));
        let lines = parse(&text, None).unwrap();
        let got: Vec<(usize, CommandId)> = lines.iter().map(|l| (l.number, l.envelope.command_id)).collect();
        assert_eq!(got, vec![(3, a.command_id), (4, b.command_id)]);
        assert_eq!(lines[0].envelope.issuer.as_str(), "op:script", "the line's issuer stays without --issuer");
        let issuer = Issuer::new("op:migration").unwrap();
        let lines = parse(&text, Some(&issuer)).unwrap();
        assert!(lines.iter().all(|l| l.envelope.issuer == issuer), "--issuer replaces each line's");

        let heartbeat = Envelope::new(
            CommandId::generate(),
            Issuer::new("w1").unwrap(),
            Timestamp(1),
            Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(1) },
        );
        let text = format!("{}\n{{\"nope\": 1}}\n{}\nnot json\n", json(&a), json(&heartbeat));
        let error = format!("{:#}", parse(&text, None).unwrap_err());
        assert!(error.contains("3 bad line(s)"), "{error}");
        assert!(error.contains("line 2: "), "{error}");
        assert!(
            error.contains("line 3: agent.heartbeat is an agent command; publish takes op commands only"),
            "{error}"
        );
        assert!(error.contains("line 4: "), "{error}");
        assert!(!error.contains("line 1:"), "{error}");
        assert!(parse("# nothing\n\n", None).is_err(), "a file without commands is refused");
    }

    #[tokio::test]
    async fn straight_to_the_log_each_command_is_stored_once_and_another_under_a_used_id_is_refused() {
        let log = Embedded::in_memory(2, system_clock()).unwrap();
        let (a, b) = (allocate(CommandId::generate()), allocate(CommandId::generate()));
        let another = allocate(a.command_id);
        let answers = publish_to_log(&log, &[a.clone(), b.clone(), a.clone(), another], None).await.unwrap();
        let summary: Vec<(Option<u64>, bool, Option<u16>)> = answers
            .iter()
            .map(|answer| match answer {
                BatchItem::Published(status) => (status.command_seq, status.duplicate, None),
                BatchItem::Refused(refusal) => (None, false, Some(refusal.status_code)),
            })
            .collect();
        assert_eq!(
            summary,
            vec![(Some(1), false, None), (Some(2), false, None), (Some(1), true, None), (None, false, Some(409))]
        );
        let BatchItem::Refused(refusal) = &answers[3] else { unreachable!() };
        assert_eq!(refusal.index, 3);
        assert!(refusal.error.contains("names another command"), "{}", refusal.error);
        assert_eq!(log.last_command_seq().await.unwrap(), 2, "two commands stored, once each");
    }
}
