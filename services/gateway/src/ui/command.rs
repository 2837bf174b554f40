//! `GET /ui/commands/{id}`: where one command stands, as `GET /v1/commands/{id}` says it — its outcome (each part:
//! the decision, the effects, who issued it and when, where it is in the log) with links to what it is about, or
//! its dead letter (why, and on which subject).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_schemas::Outcome;
use leasehold_schemas::outcome::Effect;
use maud::{Markup, html};
use serde_json::Value;

use super::parts::{path_param, refused};
use super::{Page, Ui, bdi, link, page, timestamp};
use crate::commands::{CommandStatus, DeadLetterView, PositionedOutcome, lookup};
use crate::events::About;

pub(crate) async fn get<L: Log>(State(ui): State<Arc<Ui<L>>>, id: Result<Path<String>, PathRejection>) -> Response {
    let id = match path_param(id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match lookup(&ui.api, &id, None).await {
        Ok(status) => page(Page::new(format!("Command {id}")), render(&status)).into_response(),
        Err(refusal) => refused(refusal),
    }
}

fn render(status: &CommandStatus) -> Markup {
    html! {
        section id="status" {
            dl.fields {
                dt { "Status" } dd { (status.status) }
                dt { "Command sequence" } dd {
                    @match status.command_seq { Some(seq) => { (seq) }, None => { "–" } }
                }
                @if let Some(rejection) = &status.rejection {
                    dt { "Rejected" } dd.error { (rejection.kind.to_string()) ": " (bdi(&rejection.message)) }
                }
                @if let Some(detail) = &status.detail {
                    dt { "Note" } dd { (bdi(detail)) }
                }
            }
        }
        @for part in &status.outcomes { (outcome(part)) }
        @if let Some(letter) = &status.dead_letter { (dead_letter(letter)) }
    }
}

fn outcome(part: &PositionedOutcome) -> Markup {
    let outcome = &part.outcome;
    let command = &outcome.command;
    html! {
        section.outcome {
            h2 { "Outcome " (outcome.part + 1) " " span.note { "(outcome sequence " (part.seq) ")" } }
            dl.fields {
                dt { "Command" } dd { (bdi(&command.type_name)) " (" (command.class.to_string()) ")" }
                dt { "Issuer" } dd { (bdi(command.issuer.as_str())) }
                dt { "Issued at" } dd { (timestamp(command.issued_at.0)) }
                dt { "Log time" } dd { (timestamp(outcome.log_time.0)) }
                dt { "Decided at" } dd { (timestamp(outcome.decided_at.0)) }
                dt { "Partition" } dd { (outcome.partition) }
                dt { "Command sequence" } dd { (outcome.cmd_seq) }
                dt { "Decision" } dd {
                    @match outcome.rejection() {
                        Some(rejection) => {
                            span.error { "rejected, " (rejection.kind.to_string()) } ": " (bdi(&rejection.message))
                        }
                        None => { "accepted" }
                    }
                }
            }
            @if !outcome.effects().is_empty() {
                h3 { "Effects" }
                ol.effects {
                    @for (position, effect) in outcome.positioned_effects() {
                        li { span.note { (position.0) " " } code { (bdi(&effect_text(effect))) } }
                    }
                }
            }
            (about(outcome))
        }
    }
}

fn dead_letter(letter: &DeadLetterView) -> Markup {
    html! {
        section id="dead-letter" {
            h2 { "Dead-lettered" }
            dl.fields {
                dt { "Reason" } dd.error { (bdi(&letter.reason)) }
                dt { "Subject" } dd { (bdi(&letter.subject)) }
                dt { "Stored at" } dd { "command sequence " (letter.source_seq) }
                dt { "Id" } dd {
                    @if letter.id_verified { "named by the command itself" }
                    @else { "only the message id it was published under" }
                }
            }
        }
    }
}

/// An effect as text: its name, then its fields in JSON (what the command line prints).
fn effect_text(effect: &Effect) -> String {
    let fields = match serde_json::to_value(effect) {
        Ok(Value::Object(map)) => map.into_iter().next().map(|(_, fields)| fields),
        _ => None,
    };
    match fields {
        Some(Value::Object(fields)) if fields.is_empty() => effect.name().to_owned(),
        Some(fields) => format!("{} {fields}", effect.name()),
        None => effect.name().to_owned(),
    }
}

/// Links to what `outcome` is about ([`About`]: its subject, and the resources, leases and pools its effects
/// mention), with the agents of those resources.
fn about(outcome: &Outcome) -> Markup {
    let about = About::of(outcome);
    let mut agents: BTreeSet<&str> = about.agents.iter().map(String::as_str).collect();
    agents.extend(about.resources.iter().filter_map(|r| r.split_once('.').map(|(agent, _)| agent)));
    let agents: Vec<&str> = agents.into_iter().collect();
    let resources: Vec<&str> = about.resources.iter().map(String::as_str).collect();
    let leases: Vec<&str> = about.leases.iter().map(String::as_str).collect();
    let pools: Vec<&str> = about.pools.iter().map(String::as_str).collect();
    let lists = [
        ("Resources", "/ui/resources", resources),
        ("Leases", "/ui/leases", leases),
        ("Agents", "/ui/agents", agents),
        ("Pools", "/ui/pools", pools),
    ];
    html! {
        @if lists.iter().any(|(_, _, names)| !names.is_empty()) {
            dl.fields.about {
                @for (label, prefix, names) in &lists {
                    @if !names.is_empty() {
                        dt { (label) }
                        dd {
                            @for (i, name) in names.iter().enumerate() {
                                @if i > 0 { ", " }
                                (link(prefix, name))
                            }
                        }
                    }
                }
                @if about.more > 0 {
                    dt { "And" } dd { (about.more) " more" }
                }
            }
        }
    }
}
