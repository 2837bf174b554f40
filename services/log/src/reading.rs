//! How a writer reads its partition's commands: strictly in sequence after its cursor, from what the consumer
//! delivers when the deliveries prove they leave nothing out, and by sequence from the log when they do not.
//!
//! A [`Reader`] is the state machine alone (no I/O): the JetStream owner feeds it the consumer's deliveries and the
//! answers of its reads by sequence, and the deterministic simulation feeds it the same from a modelled consumer
//! (duplicates, redeliveries after a pin moves, an old owner's late deliveries, takeovers between batches), so both
//! run this code.
//!
//! What a delivery proves. A JetStream consumer numbers every delivery it makes (its delivery sequence, in the ack
//! subject): one more for each message it sends, a redelivery included. A first delivery (delivery count 1) comes
//! from the consumer's position in the stream, which only moves forward through the messages its filter matches.
//! So when two first deliveries have delivery sequences `j < k` and every delivery between them was a redelivery,
//! the consumer went from the first's stream sequence straight to the second's: no command of the partition lies
//! between them. Deliveries to one owner arrive in the order they are numbered (one consumer leader, one
//! connection; a new leader or a recreated consumer pins anew, and the owner is lost), so a number at or below one
//! already seen means the consumer numbers anew (a reset keeps the pin): everything linked and not yet followed is
//! forgotten. Such a pair is a *link*; the reader chains links from a sequence it knows (its cursor, or the end
//! of a read by sequence) and hands out only commands up to where the chain reaches ([`Reader::next`]). Whatever
//! the chain cannot vouch for (the first delivery after a takeover, deliveries around a gap, a consumer whose
//! numbering restarted) is read by sequence from the log instead ([`Next::Read`]). Nothing is ever handed out past
//! a command the reader has not seen, whatever order deliveries come in.

use std::collections::BTreeMap;

use crate::{CommandRecord, Error};

/// The commands a read by sequence up to a first delivery asks for first (see [`read_by_sequence`]).
const FIRST_READ: usize = 8;

/// How many deliveries the reader remembers to find links in (the newest ones).
const REMEMBERED: usize = 4096;

/// One message the consumer delivered.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The consumer's delivery sequence: one more for every message it sends.
    pub dseq: u64,
    /// Whether this is the message's first delivery (delivery count 1).
    pub first: bool,
    /// The command (its stream sequence, subject, log time and payload).
    pub record: CommandRecord,
}

/// What the owner should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Commands to hand out, strictly in sequence after the cursor.
    Ready(Vec<CommandRecord>),
    /// Read by sequence after `after` (a delivery waits beyond what the reader can vouch for, or nothing is known
    /// yet), then give the answer to [`Reader::read`]. `through`: the sequence the read should reach (from the
    /// stream's leader, if a replica lags). `bounded`: it is the lowest first delivery at hand beyond `after`, and
    /// the read need not pass it (the links carry on from there; the gap before it is usually empty or a few
    /// commands); otherwise it is the highest delivered (what is at hand beyond `after` are redeliveries, which
    /// link nothing), and the read takes as much as it may.
    Read { after: u64, through: u64, bounded: bool },
    /// Nothing waits: wait for a delivery.
    Wait,
}

/// A writer's reading of one partition (see the module's documentation).
#[derive(Debug, Default)]
pub struct Reader {
    /// Commands at hand, by stream sequence, above `done`.
    held: BTreeMap<u64, CommandRecord>,
    /// Every command of the partition in `(done, known]` is in `held`; `None`: nothing known yet.
    known: Option<u64>,
    /// Everything up to here is done with (or before the cursor the reading started from).
    done: u64,
    /// Recent deliveries: delivery sequence -> (stream sequence, first delivery).
    deliveries: BTreeMap<u64, (u64, bool)>,
    /// Links: stream sequence -> the stream sequence of a first delivery before it, with no command between.
    links: BTreeMap<u64, u64>,
    /// What the reader saw.
    pub stats: ReaderStats,
}

/// Counts of what a reader saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReaderStats {
    /// Deliveries taken in.
    pub delivered: u64,
    /// Reads by sequence asked for.
    pub reads: u64,
    /// Commands the reads by sequence brought.
    pub read_records: u64,
    /// Times the consumer's numbering was found restarted (what it linked forgotten).
    pub renumbered: u64,
}

impl Reader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes in a delivery.
    pub fn delivered(&mut self, delivery: Delivery) {
        self.stats.delivered += 1;
        let Delivery { dseq, first, record } = delivery;
        let seq = record.seq;
        if self.deliveries.last_key_value().is_some_and(|(&newest, _)| dseq <= newest) {
            // A consumer's deliveries to one owner come in the order it numbers them, so a number at or below one
            // seen means it numbers them anew (a reset, which keeps the pin; a restore): what the old numbers said
            // proves nothing about the new ones, and a link between the two numberings would be false. Links not
            // followed yet go too.
            self.stats.renumbered += 1;
            self.deliveries.clear();
            self.links.clear();
        }
        self.deliveries.insert(dseq, (seq, first));
        if self.deliveries.len() > REMEMBERED {
            self.deliveries.pop_first();
        }
        if first
            && let Some(before) = self.first_before(dseq)
            && before < seq
        {
            self.link(before, seq);
        }
        if seq > self.done {
            self.held.entry(seq).or_insert(record);
        }
    }

    /// The stream sequence of the nearest first delivery before delivery `dseq`, when every delivery between them
    /// was seen and is a redelivery.
    fn first_before(&self, dseq: u64) -> Option<u64> {
        let mut at = dseq;
        loop {
            at = at.checked_sub(1)?;
            let &(seq, first) = self.deliveries.get(&at)?;
            if first {
                return Some(seq);
            }
        }
    }

    fn link(&mut self, before: u64, seq: u64) {
        if seq > self.done {
            let at = self.links.entry(seq).or_insert(before);
            *at = (*at).min(before);
        }
    }

    /// Takes in a read by sequence after `after`: `records` are every command of the partition after `after`, in
    /// order, up to the last of them, and no other lies in `(after, through]`.
    pub fn read(&mut self, after: u64, records: Vec<CommandRecord>, through: u64) {
        self.stats.read_records += records.len() as u64;
        let reached = records.last().map_or(after, |r| r.seq).max(through);
        match self.known {
            None => {
                // The reading starts here: what lies at or before `after` is the caller's.
                self.done_through(after);
                self.known = Some(reached.max(self.done));
            }
            Some(known) if after <= known => self.known = Some(known.max(reached)),
            Some(_) => {}
        }
        for record in records {
            if record.seq > self.done {
                self.held.entry(record.seq).or_insert(record);
            }
        }
    }

    /// What to do for the commands after `after` (the caller's cursor), at most `max` of them.
    pub fn next(&mut self, after: u64, max: usize) -> Next {
        if after < self.done {
            // The caller went back before what it said was done with (it reloaded from a log that holds less).
            self.done = after;
            self.known = None;
        }
        let Some(mut known) = self.known else {
            self.stats.reads += 1;
            return self.read_after(after);
        };
        if after > known {
            // The caller is past what the reader knew (another writer decided those): nothing there is needed.
            self.done_through(after);
            known = after;
        }
        // Follow the links from what is known: in ascending order, one pass reaches as far as they go.
        for (&seq, &before) in self.links.range(known + 1..) {
            if before <= known {
                known = seq;
            }
        }
        self.known = Some(known);
        let ready: Vec<CommandRecord> = self
            .held
            .range(after + 1..)
            .take_while(|&(&seq, _)| seq <= known)
            .take(max)
            .map(|(_, r)| r.clone())
            .collect();
        if !ready.is_empty() || max == 0 {
            return Next::Ready(ready);
        }
        if self.held.range(known + 1..).next().is_some() {
            self.stats.reads += 1;
            return self.read_after(known);
        }
        Next::Wait
    }

    /// A read by sequence after `seq`: up to the lowest first delivery beyond it, or as far as it may.
    fn read_after(&self, seq: u64) -> Next {
        let first = self.deliveries.values().filter(|&&(at, first)| first && at > seq).map(|&(at, _)| at).min();
        match first {
            Some(first) => Next::Read { after: seq, through: first, bounded: true },
            None => Next::Read { after: seq, through: self.highest(), bounded: false },
        }
    }

    /// Everything up to `seq` is done with: its commands and links are dropped.
    pub fn done_through(&mut self, seq: u64) {
        if seq <= self.done {
            return;
        }
        self.done = seq;
        self.held = self.held.split_off(&(seq + 1));
        self.links = self.links.split_off(&(seq + 1));
        if let Some(known) = self.known {
            self.known = Some(known.max(seq));
        }
    }

    /// Up to where every command is known (`None`: nothing yet).
    pub fn known(&self) -> Option<u64> {
        self.known
    }

    /// The highest sequence at hand (0: none).
    pub fn highest(&self) -> u64 {
        self.held.last_key_value().map_or(0, |(&seq, _)| seq)
    }
}

/// A model of a JetStream pull consumer on one partition's commands, as far as a [`Reader`] can tell: its delivery
/// numbering, its position, what it delivered and was not acked, and `AckAll`. The deterministic simulation and this
/// module's tests deliver through it (`nats-server`'s `consumer.go`: every delivery takes the next delivery
/// sequence; first deliveries go on from the position through the filter's messages; an ack acks everything up to
/// it).
#[doc(hidden)]
#[derive(Debug, Default, Clone)]
pub struct ModelConsumer {
    next_dseq: u64,
    /// The stream sequence first deliveries go on after.
    position: u64,
    /// Delivered and not acked: stream sequence -> (delivery count, the command).
    pending: BTreeMap<u64, (u64, CommandRecord)>,
}

impl ModelConsumer {
    /// A consumer whose first delivery is the first command after `start`.
    pub fn starting_after(start: u64) -> Self {
        ModelConsumer { next_dseq: 1, position: start, pending: BTreeMap::new() }
    }

    /// Up to `max` deliveries: the pending ones again first when `redeliver` (their ack wait ran out), then first
    /// deliveries of `commands` (the partition's commands after the position, in order, as the log holds them).
    pub fn pull(&mut self, commands: &[CommandRecord], max: usize, redeliver: bool) -> Vec<Delivery> {
        let mut out = Vec::new();
        if redeliver {
            for (count, record) in self.pending.values_mut().take(max) {
                *count += 1;
                out.push(Delivery { dseq: self.next_dseq, first: false, record: record.clone() });
                self.next_dseq += 1;
            }
        }
        let start = self.position;
        for record in commands.iter().filter(|c| c.seq > start) {
            if out.len() >= max {
                break;
            }
            self.position = record.seq;
            self.pending.insert(record.seq, (1, record.clone()));
            out.push(Delivery { dseq: self.next_dseq, first: true, record: record.clone() });
            self.next_dseq += 1;
        }
        out
    }

    /// `AckAll`: everything up to `seq` is acked.
    pub fn ack(&mut self, seq: u64) {
        self.pending = self.pending.split_off(&(seq + 1));
    }

    /// Where first deliveries go on after.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// How many deliveries wait for an ack.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// A read by sequence of up to `max` commands after `after`, as [`Next::Read`] asks: `replica(after, ask)` answers
/// up to `ask` commands after `after` from any replica (one that lags answers a prefix of the log), `leader(seq)`
/// the first command at or after `seq` from the stream's leader (`None`: it holds none). The replica's answer is
/// completed from the leader up to `through`. Returns the commands and the sequence up to which no other command
/// lies, for [`Reader::read`].
///
/// `bounded`: `through` is a first delivery at hand, and the read need not go beyond it (the deliveries link on
/// from there). A read by sequence cannot be told where to stop, only how many to answer, so it asks for a few
/// first and twice as many each time after, until it passes `through`: a new owner reads the gap before the
/// consumer's first delivery (usually none), not a whole batch the consumer is delivering anyway.
pub async fn read_by_sequence<R, L>(
    after: u64,
    max: usize,
    through: u64,
    bounded: bool,
    mut replica: impl FnMut(u64, usize) -> R,
    mut leader: impl FnMut(u64) -> L,
) -> Result<(Vec<CommandRecord>, u64), Error>
where
    R: Future<Output = Result<Vec<CommandRecord>, Error>>,
    L: Future<Output = Result<Option<CommandRecord>, Error>>,
{
    let bounded = bounded && through > after;
    let mut ask = if bounded { max.min(FIRST_READ) } else { max };
    let mut found = replica(after, ask).await?;
    let mut answered = found.len();
    while bounded && answered == ask && found.len() < max {
        let Some(last) = found.last().map(|c| c.seq).filter(|&last| last < through) else { break };
        ask = (ask * 2).min(max - found.len());
        let more = replica(last, ask).await?;
        answered = more.len();
        found.extend(more);
    }
    let mut next = found.last().map_or(after, |c| c.seq) + 1;
    let mut covered = 0;
    while found.len() < max && next <= through {
        let Some(command) = leader(next).await? else {
            // The leader holds nothing more: the delivery was a command no longer held (aged out).
            covered = through;
            break;
        };
        next = command.seq + 1;
        found.push(command);
    }
    if bounded && next > through {
        // Read without a gap from `after` up to the first delivery.
        covered = covered.max(through);
    }
    Ok((found, covered))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use leasehold_schemas::Timestamp;

    use super::*;

    fn command(seq: u64) -> CommandRecord {
        CommandRecord {
            seq,
            subject: format!("lh.cmd.0.op.a.{seq}"),
            time: Timestamp(seq),
            payload: Bytes::from(seq.to_string()),
        }
    }

    fn delivery(dseq: u64, seq: u64, first: bool) -> Delivery {
        Delivery { dseq, first, record: command(seq) }
    }

    fn seqs(next: Next) -> Vec<u64> {
        match next {
            Next::Ready(found) => found.iter().map(|c| c.seq).collect(),
            other => panic!("expected commands, got {other:?}"),
        }
    }

    /// A partition's commands: sparse stream sequences (other partitions take the rest).
    fn partition_commands(rng: &mut crate::intercept::SeededRng) -> Vec<CommandRecord> {
        let mut seq = 0;
        (0..(20 + rng.next_u64() % 60))
            .map(|_| {
                seq += 1 + rng.next_u64() % 4;
                command(seq)
            })
            .collect()
    }

    /// How many of `total` commands the log holds after a round: a few more, at times.
    fn more_visible(rng: &mut crate::intercept::SeededRng, visible: usize, total: usize) -> usize {
        if visible < total && rng.chance(60) { (visible + 1 + rng.next_u64() as usize % 3).min(total) } else { visible }
    }

    /// A pull of what `log` holds from `consumer`, through a route's faults: a delivery gone to another client,
    /// two arriving out of order, one held back on the way (into `late`) and one held back before arriving.
    fn faulty_pull(
        rng: &mut crate::intercept::SeededRng,
        consumer: &mut ModelConsumer,
        log: &[CommandRecord],
        late: &mut Vec<Delivery>,
    ) -> Vec<Delivery> {
        let mut batch = consumer.pull(log, 1 + rng.next_u64() as usize % 6, rng.chance(10));
        if rng.chance(15) && !batch.is_empty() {
            let at = rng.next_u64() as usize % batch.len();
            batch.remove(at);
        }
        if rng.chance(15) && batch.len() > 1 {
            let at = rng.next_u64() as usize % (batch.len() - 1);
            batch.swap(at, at + 1);
        }
        if rng.chance(10) && !batch.is_empty() {
            late.push(batch.remove(0));
        }
        if rng.chance(10) && !late.is_empty() {
            batch.push(late.remove(0));
        }
        batch
    }

    #[test]
    fn a_new_reader_reads_from_the_cursor_first() {
        let mut reader = Reader::new();
        reader.delivered(delivery(7, 9, true));
        // The delivery alone proves nothing about what lies between the cursor and it.
        assert_eq!(reader.next(4, 10), Next::Read { after: 4, through: 9, bounded: true });
        reader.read(4, vec![command(6), command(9)], 0);
        assert_eq!(seqs(reader.next(4, 10)), vec![6, 9]);
        assert_eq!(reader.next(9, 10), Next::Wait);
    }

    #[test]
    fn consecutive_first_deliveries_are_handed_out_without_a_read() {
        let mut reader = Reader::new();
        assert_eq!(reader.next(0, 10), Next::Read { after: 0, through: 0, bounded: false });
        reader.read(0, vec![command(2)], 0);
        reader.delivered(delivery(1, 2, true));
        reader.delivered(delivery(2, 5, true));
        reader.delivered(delivery(3, 11, true));
        assert_eq!(seqs(reader.next(0, 10)), vec![2, 5, 11]);
        assert_eq!(seqs(reader.next(2, 1)), vec![5]);
        reader.done_through(11);
        assert_eq!(reader.next(11, 10), Next::Wait);
        assert_eq!(reader.stats.reads, 1);
    }

    #[test]
    fn a_delivery_number_that_went_elsewhere_makes_a_read() {
        let mut reader = Reader::new();
        reader.read(0, Vec::new(), 0);
        reader.delivered(delivery(1, 3, true));
        assert_eq!(reader.next(0, 10), Next::Read { after: 0, through: 3, bounded: true });
        reader.read(0, vec![command(3)], 0);
        // Delivery 2 went to another client (an old owner): 4 may hide between 3 and 8.
        reader.delivered(delivery(3, 8, true));
        assert_eq!(seqs(reader.next(0, 10)), vec![3]);
        assert_eq!(reader.next(3, 10), Next::Read { after: 3, through: 8, bounded: true });
        reader.read(3, vec![command(4), command(8)], 0);
        assert_eq!(seqs(reader.next(3, 10)), vec![4, 8]);
    }

    #[test]
    fn redeliveries_between_two_first_deliveries_keep_the_link() {
        let mut reader = Reader::new();
        reader.read(0, vec![command(1), command(2)], 0);
        reader.delivered(delivery(1, 2, true));
        reader.delivered(delivery(2, 1, false));
        reader.delivered(delivery(3, 2, false));
        reader.delivered(delivery(4, 6, true));
        assert_eq!(seqs(reader.next(0, 10)), vec![1, 2, 6]);
        assert_eq!(reader.stats.reads, 0);
    }

    #[test]
    fn a_delivery_number_that_goes_back_is_a_new_numbering_and_makes_a_read() {
        let mut reader = Reader::new();
        reader.read(0, vec![command(3)], 0);
        reader.delivered(delivery(1, 3, true));
        reader.delivered(delivery(3, 9, true));
        // Delivery 2 has not come: 9 cannot be vouched for.
        assert_eq!(seqs(reader.next(0, 10)), vec![3]);
        // A number below one seen: the consumer numbers anew, and nothing it says links to the old numbers.
        reader.delivered(delivery(2, 5, true));
        assert_eq!(reader.stats.renumbered, 1);
        assert_eq!(reader.next(3, 10), Next::Read { after: 3, through: 5, bounded: true });
        reader.read(3, vec![command(5), command(7), command(9)], 0);
        assert_eq!(seqs(reader.next(3, 10)), vec![5, 7, 9]);
    }

    #[test]
    fn a_renumbered_consumer_forgets_what_the_old_numbers_linked() {
        let mut reader = Reader::new();
        reader.read(0, vec![command(2)], 0);
        reader.delivered(delivery(1, 2, true));
        reader.delivered(delivery(2, 4, true));
        assert_eq!(seqs(reader.next(0, 10)), vec![2, 4]);
        reader.done_through(4);
        // Reset: numbering starts again at 1, and delivery 2 is now another message.
        reader.delivered(delivery(2, 10, true));
        reader.delivered(delivery(3, 12, true));
        assert_eq!(reader.stats.renumbered, 1);
        assert_eq!(reader.next(4, 10), Next::Read { after: 4, through: 10, bounded: true });
    }

    /// A consumer reset (`$JS.API.CONSUMER.RESET`, `nats consumer reset`) numbers deliveries from 1 again and keeps
    /// the pin. Here an old owner took deliveries 1 to 3 (commands 1 to 3) and this reader saw only delivery 4
    /// (command 4). After a reset to command 1, the new numbering spends delivery 2 on a redelivery, so its delivery
    /// 3 is command 2: it lands next to the old delivery 4 without colliding with anything remembered, and links 2
    /// to 4 across two numberings, although 3 lies between and was never seen.
    #[test]
    fn a_reset_consumer_never_links_its_new_numbers_to_the_old_ones() {
        let mut reader = Reader::new();
        reader.delivered(delivery(4, 4, true));
        assert_eq!(reader.next(0, 1), Next::Read { after: 0, through: 4, bounded: true });
        reader.read(0, vec![command(1)], 0);
        assert_eq!(seqs(reader.next(0, 1)), vec![1]);
        // The reset: 1 first, 1 again after its ack wait, then (once 1 is acked) 2.
        reader.delivered(delivery(1, 1, true));
        reader.delivered(delivery(2, 1, false));
        reader.delivered(delivery(3, 2, true));
        let mut handed = Vec::new();
        let mut cursor = 1;
        for _ in 0..8 {
            match reader.next(cursor, 1) {
                Next::Ready(found) => {
                    for c in found {
                        handed.push(c.seq);
                        cursor = c.seq;
                    }
                }
                Next::Read { after, .. } => {
                    let found = (after + 1..=4).map(command).take(1).collect();
                    reader.read(after, found, 0);
                }
                Next::Wait => break,
            }
        }
        assert_eq!(handed, vec![2, 3, 4], "a command the reader never saw was passed over");
    }

    #[test]
    fn a_caller_that_goes_back_is_read_for_again() {
        let mut reader = Reader::new();
        reader.read(0, vec![command(1), command(2), command(3)], 0);
        assert_eq!(seqs(reader.next(0, 10)), vec![1, 2, 3]);
        reader.done_through(3);
        assert_eq!(reader.next(1, 10), Next::Read { after: 1, through: 0, bounded: false });
        reader.read(1, vec![command(2), command(3)], 0);
        assert_eq!(seqs(reader.next(1, 10)), vec![2, 3]);
    }

    #[test]
    fn a_read_short_of_the_deliveries_is_asked_again() {
        let mut reader = Reader::new();
        reader.delivered(delivery(5, 7, true));
        assert_eq!(reader.next(0, 10), Next::Read { after: 0, through: 7, bounded: true });
        // A replica behind the leader answers with less than was delivered.
        reader.read(0, vec![command(2)], 0);
        assert_eq!(seqs(reader.next(0, 10)), vec![2]);
        assert_eq!(reader.next(2, 10), Next::Read { after: 2, through: 7, bounded: true });
    }

    /// Many seeded runs of a consumer whose deliveries are lost (they went to another client), doubled, reordered
    /// and delivered again, whose reads by sequence are the JetStream owner's ([`read_by_sequence`], from replicas
    /// that may lag), and whose caller goes back at times: what the reader hands out is always the partition's
    /// commands in order, none skipped, and it gets them all.
    #[test]
    fn a_reader_never_skips_a_command_whatever_the_consumer_does() {
        use crate::intercept::SeededRng;
        let (mut reads, mut commands_handed) = (0, 0);
        for seed in 0..2000 {
            let mut rng = SeededRng::new(seed);
            let commands = partition_commands(&mut rng);
            let mut visible = 1 + rng.next_u64() as usize % commands.len();
            let mut consumer = ModelConsumer::starting_after(0);
            let mut reader = Reader::new();
            let mut cursor = 0;
            let mut landed = 0;
            let mut handed = Vec::new();
            let mut late = Vec::new();
            for _round in 0..400 {
                visible = more_visible(&mut rng, visible, commands.len());
                let log = &commands[..visible];
                let mut batch = faulty_pull(&mut rng, &mut consumer, log, &mut late);
                if rng.chance(5) && !batch.is_empty() {
                    batch.push(batch[0].clone());
                }
                for delivery in batch {
                    reader.delivered(delivery);
                }
                if rng.chance(5) && landed < cursor {
                    // An append did not land: the caller reloads from what did.
                    cursor = landed;
                    handed.retain(|&s| s <= landed);
                }
                for _ in 0..3 {
                    let max = 1 + rng.next_u64() as usize % 12;
                    match reader.next(cursor, max) {
                        Next::Ready(found) => {
                            for c in found {
                                handed.push(c.seq);
                                cursor = c.seq;
                            }
                            if rng.chance(70) {
                                landed = cursor;
                                reader.done_through(landed);
                                consumer.ack(landed);
                            }
                        }
                        Next::Read { after, through, bounded } => {
                            let (found, covered) = owner_read(&mut rng, log, after, max, through, bounded);
                            reader.read(after, found, covered);
                        }
                        Next::Wait => break,
                    }
                }
            }
            let expected: Vec<u64> = commands.iter().map(|c| c.seq).filter(|&s| s <= cursor).collect();
            assert_eq!(handed, expected, "seed {seed}: handed out out of order or with a gap");
            // Then without faults: everything comes.
            for delivery in consumer.pull(&commands, usize::MAX, true) {
                reader.delivered(delivery);
            }
            for _ in 0..100 {
                match reader.next(cursor, 8) {
                    Next::Ready(found) => {
                        handed.extend(found.iter().map(|c| c.seq));
                        cursor = found.last().map_or(cursor, |c| c.seq);
                    }
                    Next::Read { after, through, bounded } => {
                        let (found, covered) = owner_read(&mut rng, &commands, after, 8, through, bounded);
                        reader.read(after, found, covered);
                    }
                    Next::Wait => break,
                }
            }
            let all: Vec<u64> = commands.iter().map(|c| c.seq).collect();
            assert_eq!(handed, all, "seed {seed}: not every command came, in order");
            reads += reader.stats.reads;
            commands_handed += all.len() as u64;
        }
        // The deliveries carry most of it: reads by sequence fill the gaps the faults make.
        assert!(reads * 3 < commands_handed, "{reads} reads for {commands_handed} commands");
    }

    /// A read by sequence as the JetStream owner makes it ([`read_by_sequence`]), from replicas that may lag (each
    /// answer from a prefix of the log) and a leader that holds it all.
    fn owner_read(
        rng: &mut crate::intercept::SeededRng,
        log: &[CommandRecord],
        after: u64,
        max: usize,
        through: u64,
        bounded: bool,
    ) -> (Vec<CommandRecord>, u64) {
        use futures::FutureExt;
        let replica = |after: u64, ask: usize| {
            let held = if rng.chance(30) { rng.next_u64() as usize % (log.len() + 1) } else { log.len() };
            std::future::ready(Ok(log[..held].iter().filter(|c| c.seq > after).take(ask).cloned().collect()))
        };
        let leader = |next: u64| std::future::ready(Ok(log.iter().find(|c| c.seq >= next).cloned()));
        read_by_sequence(after, max, through, bounded, replica, leader)
            .now_or_never()
            .expect("answered at once")
            .expect("a read")
    }
}
