// A reference agentmesh agent in TypeScript, written from PROTOCOL.md with
// the official NATS packages. It handles the conformance kit's test actions
// (PROTOCOL.md §13): conformance.echo and conformance.reject.
//
// Configuration (environment): NATS_URL (default nats://127.0.0.1:4222),
// AGENT_ID (default ts_agent), MESH_PREFIX (default mesh), HEARTBEAT_MS
// (default 5000).
//
// It takes conformance.echo notifications from broadcasts (its fan-out
// consumers, PROTOCOL.md §3, subscribe to no topic) and ignores every
// other broadcast; only direct messages are answered. It sends no
// requests of its own, so every reply it receives is a late one.

import { connect, headers, type NatsConnection } from "@nats-io/transport-node";
import {
  AckPolicy, DeliverPolicy, jetstream, jetstreamManager, RetentionPolicy, StorageType,
  type ConsumerMessages, type JetStreamClient, type JsMsg,
} from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import { Objm, type ObjectStore } from "@nats-io/obj";
import { randomUUID } from "node:crypto";
import {
  decode, encode, expired, InvalidEnvelope, newAck, newErrorReply, newResponse, PRIORITIES, RETRYABLE, stub,
  validMessageID, type Envelope, type Priority, type WireError,
} from "./envelope.js";

const NATS_URL = process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const ID = process.env.AGENT_ID ?? "ts_agent";
const PREFIX = process.env.MESH_PREFIX ?? "mesh";
const HEARTBEAT_MS = Number(process.env.HEARTBEAT_MS ?? 5000);

const STREAM = PREFIX.toUpperCase();
const REGISTRY = `${PREFIX}_registry`;
const PAYLOADS = `${PREFIX}_payloads`;
const INSTANCE = randomUUID().replaceAll("-", "");
const MAX_ENVELOPE = 16 << 20; // PROTOCOL.md §7
const NS = 1_000_000; // nanoseconds per millisecond
const DAY_MS = 24 * 3600 * 1000;

// The default delivery policy per priority (PROTOCOL.md §3).
type Policy = { backoffMs: number[]; maxDeliver: number; limitMs: number };
const POLICIES: Record<Priority, Policy> = {
  critical: { backoffMs: [2e3, 4e3, 8e3, 16e3, 32e3], maxDeliver: 5, limitMs: 60e3 },
  high: { backoffMs: [5e3, 10e3, 20e3, 40e3], maxDeliver: 4, limitMs: 300e3 },
  normal: { backoffMs: [10e3, 20e3, 40e3], maxDeliver: 3, limitMs: 600e3 },
  low: { backoffMs: [30e3, 30e3], maxDeliver: 2, limitMs: 600e3 },
  batch: { backoffMs: [60e3, 60e3], maxDeliver: 2, limitMs: 1800e3 },
};

/** A handler's non-retryable failure: the message is terminated and the sender told. */
class Rejection extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

/** A failure worth retrying (any other error counts as INTERNAL). */
class Retryable extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

/** A handler returns the payload of its response, or undefined for no response. */
type Handler = (m: Envelope) => Promise<{ payload: unknown } | undefined>;

// The test actions of PROTOCOL.md §13.
const handlers: Record<string, Handler> = {
  "conformance.echo": async (m) => (m.message_type === "request" ? { payload: m.payload } : undefined),
  "conformance.reject": async (m) => {
    const p = (m.payload ?? {}) as { code?: string; message?: string };
    throw new Rejection(p.code ?? "REJECTED", p.message ?? "rejected");
  },
};

// The actions it takes from broadcasts and topics (§3, §5 checks 2 and 14).
const FANOUT_ACTIONS = new Set(["conformance.echo"]);

// The fan-out classes (§3): the consumer's policy is its first priority's.
const FANOUT_CLASSES: Record<string, Priority[]> = { urgent: ["critical", "high"], bulk: ["normal", "low", "batch"] };

let nc: NatsConnection;
let js: JetStreamClient;
let registry: KV;
let payloadStore: Promise<ObjectStore> | undefined;
let inFlight = 0;
let stopping = false;
const settled = new Map<number, number>(); // stream seq → when this instance settled it (duplicates, §5 check 3)

async function main(): Promise<void> {
  nc = await connect({ servers: NATS_URL, name: `agentmesh ${ID}` });
  js = jetstream(nc);
  await ensureStream();
  registry = await openRegistry();
  await announce("INITIALIZING");
  if (await registry.get(`health.${ID}`)) await registry.delete(`health.${ID}`); // clear a degraded mark at start (§8)
  const readers = await Promise.all([
    ...PRIORITIES.map((p) => ensureConsumer(p)),
    ...Object.keys(FANOUT_CLASSES).map((c) => ensureFanout(c)),
  ]);
  await announce("READY");
  const beat = setInterval(() => void heartbeat(), HEARTBEAT_MS);

  const stop = async () => {
    if (stopping) return;
    stopping = true;
    clearInterval(beat);
    await announce("STOPPING").catch(() => {});
    for (const r of readers) r.messages.stop();
    await Promise.all(readers.map((r) => r.done));
    await announce("STOPPED").catch(() => {});
    await registry.delete(`agent.${ID}.${INSTANCE}`).catch(() => {});
    await nc.drain();
  };
  process.once("SIGTERM", () => void stop());
  process.once("SIGINT", () => void stop());
  console.log(`${ID}: ready (instance ${INSTANCE})`);
  await nc.closed();
}

// ensureStream creates the MESH stream if it is missing (PROTOCOL.md §2);
// an existing stream is never changed.
async function ensureStream(): Promise<void> {
  const jsm = await jetstreamManager(nc);
  try {
    await jsm.streams.info(STREAM);
    return;
  } catch {
    // missing: create it below
  }
  const subjects = PRIORITIES.flatMap((p) => [`${PREFIX}.agent.*.${p}.*`, `${PREFIX}.topic.*.${p}.*`, `${PREFIX}.broadcast.${p}.*`]);
  await jsm.streams.add({
    name: STREAM, subjects, retention: RetentionPolicy.Limits, storage: StorageType.File,
    max_age: 7 * DAY_MS * NS, duplicate_window: 120_000 * NS, max_consumers: 100_000, num_replicas: 1, allow_batched: true,
  }).catch(async (e) => {
    await jsm.streams.info(STREAM).catch(() => { throw e; }); // another agent created it meanwhile
  });
}

// ensureConsumer creates (or updates) the direct consumer of priority p
// (PROTOCOL.md §3) and starts reading it.
async function ensureConsumer(p: Priority): Promise<{ messages: ConsumerMessages; done: Promise<void> }> {
  const pol = POLICIES[p];
  const name = `${ID}_${p}`;
  const jsm = await jetstreamManager(nc);
  await jsm.consumers.add(STREAM, {
    durable_name: name, filter_subject: `${PREFIX}.agent.${ID}.${p}.*`, deliver_policy: DeliverPolicy.All,
    ack_policy: AckPolicy.Explicit, ack_wait: pol.backoffMs[0] * NS, backoff: pol.backoffMs.map((ms) => ms * NS),
    max_deliver: pol.maxDeliver, max_ack_pending: 1000, sample_freq: "100",
    description: `agentmesh agent ${ID}, ${p} priority`,
  });
  return read(name, pol, false);
}

// ensureFanout creates the fan-out consumer of class (§3) unless it
// exists: the server refuses to change an existing consumer's deliver
// policy, and this agent's filters (broadcasts, no topic) never change.
// It starts reading it.
async function ensureFanout(cls: string): Promise<{ messages: ConsumerMessages; done: Promise<void> }> {
  const prios = FANOUT_CLASSES[cls];
  const pol = POLICIES[prios[0]];
  const name = `${ID}_fanout-${cls}`;
  const jsm = await jetstreamManager(nc);
  const exists = await jsm.consumers.info(STREAM, name).then(() => true, () => false);
  if (!exists) {
    await jsm.consumers.add(STREAM, {
      durable_name: name, filter_subjects: prios.map((p) => `${PREFIX}.broadcast.${p}.*`), deliver_policy: DeliverPolicy.New,
      ack_policy: AckPolicy.Explicit, ack_wait: pol.backoffMs[0] * NS, backoff: pol.backoffMs.map((ms) => ms * NS),
      max_deliver: pol.maxDeliver, max_ack_pending: 1000, sample_freq: "100",
      description: `agentmesh agent ${ID}, ${cls} broadcasts and topics`,
    });
  }
  return read(name, pol, true);
}

// read consumes the consumer name, whose policy is pol, one message at a
// time: in delivery order, so per task too.
async function read(name: string, pol: Policy, fanout: boolean): Promise<{ messages: ConsumerMessages; done: Promise<void> }> {
  const consumer = await js.consumers.get(STREAM, name);
  const expires = Math.min(10_000, Math.max(2_000, 2 * pol.backoffMs[0]));
  const messages = await consumer.consume({ max_messages: 8, expires });
  const done = (async () => {
    for await (const m of messages) {
      inFlight++;
      try {
        await receive(m, fanout);
      } catch (e) {
        console.error(`${ID}: ${name}: ${(e as Error).message}`);
        m.nak(pol.backoffMs[0]);
      } finally {
        inFlight--;
      }
    }
  })();
  return { messages, done };
}

// receive runs the checks of PROTOCOL.md §5, in order, and settles m,
// which came from a fan-out consumer when fanout is set.
async function receive(m: JsMsg, fanout: boolean): Promise<void> {
  const tokens = m.subject.split(".");
  const h = m.headers;
  if (fanout) {
    if (tokens[tokens.length - 1] === ID) return m.ack(); // 1: our own broadcast
    const action = h?.get("Mesh-Action") ?? "";
    if (action !== "" && !FANOUT_ACTIONS.has(action)) return m.ack(); // 2: not an action we take from fan-out
  }
  const direct = tokens[1] === "agent";
  // Retries and the processing limit follow the message's own priority.
  const prio = (direct ? tokens[3] : tokens[tokens.length - 2]) as Priority;
  const pol = POLICIES[prio] ?? POLICIES.normal;
  const attempt = m.info.deliveryCount;
  pruneSettled();
  if (settled.has(m.seq)) return m.ack(); // 3: a redelivery of what this instance settled
  const ref = h?.get("Mesh-Envelope-Ref") ?? "";
  let env: Envelope;
  const invalid = (why: string) => settle(m, () => m.term(reason(`INVALID: ${why}`)));
  // A replay's object is the original message's: another replay may need it.
  const ack = () => settle(m, () => m.ack(), ref === (h?.get("Nats-Msg-Id") ?? "") ? ref : "");

  if (m.data.length > MAX_ENVELOPE) return invalid(`envelope of ${m.data.length} bytes exceeds the ${MAX_ENVELOPE} byte limit`); // 4
  if (h?.has("Nats-Pin-Id")) return invalid("Nats-Pin-Id header on a mesh message"); // 5
  try {
    if (ref !== "") {
      const full = await claim(ref, h?.get("Nats-Msg-Id") ?? ""); // 6
      if (typeof full === "string") return invalid(full);
      env = full;
    } else {
      env = decode(m.data); // 7
    }
  } catch (e) {
    if (e instanceof InvalidEnvelope) return invalid(`invalid envelope: ${e.message}`);
    m.nak(pol.backoffMs[Math.min(attempt - 1, pol.backoffMs.length - 1)]); // the payload store is unreachable
    return;
  }
  // 8: <prefix>.agent.<receiver>.<priority>.<sender>, <prefix>.broadcast.<priority>.<sender>
  // or <prefix>.topic.<topic>.<priority>.<sender>, the kind its consumer reads.
  const shape = tokens[0] === PREFIX && (direct ? !fanout && tokens.length === 5
    : fanout && (tokens[1] === "broadcast" && tokens.length === 4 || tokens[1] === "topic" && tokens.length === 5));
  if (!shape) return invalid(`subject ${m.subject} is not a mesh subject this consumer reads`);
  const sender = tokens[tokens.length - 1];
  // 9: the body agrees with the subject.
  if (env.sender_id !== sender) return invalid(`sender_id ${JSON.stringify(env.sender_id)} does not match the subject's sender ${JSON.stringify(sender)}`);
  if (env.priority !== prio) return invalid(`priority ${JSON.stringify(env.priority)} does not match the subject's priority ${JSON.stringify(prio)}`);
  if (direct && (env.receiver_id !== tokens[2] || tokens[2] !== ID)) return invalid(`receiver_id ${JSON.stringify(env.receiver_id ?? "")} is not this agent ${JSON.stringify(ID)}`);
  if (!direct && env.receiver_id !== undefined) return invalid(`a ${tokens[1]} message names receiver_id ${JSON.stringify(env.receiver_id)}`);
  if (tokens[1] === "topic" && env.topic !== tokens[2]) return invalid(`topic ${JSON.stringify(env.topic ?? "")} does not match the subject's topic ${JSON.stringify(tokens[2])}`);
  if (tokens[1] === "broadcast" && env.topic !== undefined) return invalid(`a broadcast names topic ${JSON.stringify(env.topic)}`);
  const taskHeader = h?.get("Mesh-Task-Id") ?? "";
  if (taskHeader !== "" && taskHeader !== (env.task_id ?? "")) return invalid(`task_id does not match the Mesh-Task-Id header`); // 10

  if (!direct && env.sender_id === ID) return ack(); // 11: our own

  const started = Date.now();
  if (expired(env)) { // 12
    await ack();
    if (env.requires_ack) await send(newAck(env, ID, failure("EXPIRED", "message expired before it was handled"), 0));
    return;
  }
  const isReply = env.in_reply_to !== undefined && ["response", "error", "ack"].includes(env.message_type);
  const handler = env.action !== undefined ? handlers[env.action] : undefined;
  if (isReply && handler === undefined) return ack(); // 13: a late reply
  if (!direct && !FANOUT_ACTIONS.has(env.action ?? "")) return ack(); // 14: ignored
  if (handler === undefined) { // 15
    const err = failure("CAPABILITY_MISSING", `agent ${ID} has no handler for action ${JSON.stringify(env.action)}`);
    await settle(m, () => m.term(reason(`${err.code}: ${err.message}`)));
    return answerFailure(env, err, started, direct);
  }

  // 16: run the handler, telling the server it is in progress, up to the priority's limit.
  const keepalive = setInterval(() => m.working(), Math.min(...pol.backoffMs) / 8);
  let timer: NodeJS.Timeout | undefined;
  try {
    const limit = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Retryable("TIMEOUT", `processing limit ${pol.limitMs}ms reached`)), pol.limitMs);
    });
    const out = await Promise.race([handler(env), limit]);
    if (out !== undefined && env.message_type === "request" && direct) await send(newResponse(env, ID, env.action!, out.payload));
    await ack();
    if (env.requires_ack) await send(newAck(env, ID, undefined, Date.now() - started));
  } catch (e) {
    const message = (e as Error).message;
    if (e instanceof Rejection) {
      const code = e.code in RETRYABLE ? e.code : "REJECTED"; // Reject with an unknown code (§5)
      await settle(m, () => m.term(reason(`${code}: ${message}`)));
      return answerFailure(env, { code, message, retryable: false }, started, direct);
    }
    const code = e instanceof Retryable ? e.code : "INTERNAL";
    m.nak(pol.backoffMs[Math.min(attempt - 1, pol.backoffMs.length - 1)]);
    if (attempt >= pol.maxDeliver) { // the last attempt: the sender hears the failure
      await answerFailure(env, { code, message: `giving up after ${attempt} attempts: ${message}`, retryable: true }, started, direct);
    }
  } finally {
    clearInterval(keepalive);
    clearTimeout(timer);
  }
}

// settle runs the broker action and remembers the message, so a
// redelivery after a lost ack is not handled twice. After an ack it
// deletes the large envelope a direct message was stored under (§7).
async function settle(m: JsMsg, action: () => void, ref = ""): Promise<void> {
  action();
  settled.set(m.seq, Date.now());
  if (ref !== "") await (await payloads()).delete(ref).catch(() => {});
}

function pruneSettled(): void {
  const cutoff = Date.now() - 2 * 60_000;
  for (const [seq, at] of settled) if (at < cutoff) settled.delete(seq);
}

function failure(code: string, message: string): WireError {
  return { code, message, retryable: RETRYABLE[code] ?? false };
}

// answerFailure tells the sender a message failed, if it expects an
// answer: a direct request, or anything with requires_ack (§6). Replies
// are never answered.
async function answerFailure(env: Envelope, err: WireError, started: number, direct: boolean): Promise<void> {
  if (["response", "error", "ack"].includes(env.message_type)) return;
  if (env.requires_ack) return send(newAck(env, ID, err, Date.now() - started));
  if (env.message_type === "request" && direct) return send(newErrorReply(env, ID, err));
}

// reason bounds a TERM reason to 512 bytes (§5).
function reason(s: string): string {
  const b = new TextEncoder().encode(s);
  return b.length <= 512 ? s : new TextDecoder().decode(b.subarray(0, 509)).replace(/\uFFFD+$/, "") + "...";
}

// send publishes a reply: to its receiver's direct subject, with the
// mirrored headers (§4), through the object store when it is too large
// for the server (§7), retrying under the same Nats-Msg-Id.
async function send(e: Envelope): Promise<void> {
  const subject = `${PREFIX}.agent.${e.receiver_id}.${e.priority}.${ID}`;
  let body = encode(e);
  const h = headers();
  const mirror: [string, string | undefined][] = [
    ["Mesh-Type", e.message_type], ["Mesh-Action", e.action ?? ""], ["Mesh-Task-Id", e.task_id],
    ["Mesh-In-Reply-To", e.in_reply_to], ["Mesh-Correlation-Id", e.correlation_id],
    ["Mesh-Workflow-Id", e.workflow_id], ["Mesh-Status", e.status],
  ];
  for (const [k, v] of mirror) if (v !== undefined && (v !== "" || k === "Mesh-Action")) h.set(k, v);
  const maxPayload = nc.info?.max_payload ?? 1 << 20;
  if (body.length > maxPayload - 4096) {
    if (body.length > MAX_ENVELOPE) throw new Error(`envelope of ${body.length} bytes exceeds ${MAX_ENVELOPE}`);
    const chunk = Math.min(128 << 10, Math.max(maxPayload - 1024, 1024));
    await (await payloads()).putBlob({ name: e.message_id, options: { max_chunk_size: chunk } }, body);
    body = encode(stub(e));
    h.set("Mesh-Envelope-Ref", e.message_id);
  }
  for (let attempt = 0; ; attempt++) {
    try {
      await js.publish(subject, body, { msgID: e.message_id, headers: h, timeout: 2000 });
      return;
    } catch (err) {
      if (attempt >= 4) throw err;
      await new Promise((r) => setTimeout(r, 50 << attempt));
    }
  }
}

// claim reads a large envelope from the object store (§7). It returns why
// the message is invalid, or throws when the store cannot be reached.
async function claim(ref: string, msgID: string): Promise<Envelope | string> {
  if ((ref !== msgID && ref !== replayOf(msgID)) || !validMessageID(ref)) return `Mesh-Envelope-Ref ${JSON.stringify(ref)} is not the message's Nats-Msg-Id`;
  const store = await payloads();
  const info = await store.info(ref);
  if (info === null || info.deleted) return `large envelope ${JSON.stringify(ref)} is not in the payload store`;
  if (info.options?.link) return `large envelope ${JSON.stringify(ref)} is a link; only objects are accepted`;
  if (info.size > MAX_ENVELOPE) return `envelope of ${info.size} bytes exceeds the ${MAX_ENVELOPE} byte limit`;
  let data: Uint8Array | null;
  try {
    data = await store.getBlob(ref); // checks the digest
  } catch (e) {
    if (/digest/i.test((e as Error).message)) return `large envelope ${JSON.stringify(ref)} does not match its digest`;
    throw e;
  }
  if (data === null) return `large envelope ${JSON.stringify(ref)} is not in the payload store`;
  if (data.length > MAX_ENVELOPE) return `envelope of more than ${MAX_ENVELOPE} bytes exceeds the limit`;
  const env = decode(data);
  if (env.message_id !== ref) return `large envelope ${JSON.stringify(ref)} has message_id ${JSON.stringify(env.message_id)}`;
  return env;
}

// replayOf is the message id a dead letter's replay id
// ("<message_id>:replay:<seq>", perhaps replayed again) was made from, or
// msgID itself when it is no replay id (§7).
function replayOf(msgID: string): string {
  let id = msgID;
  for (;;) {
    const m = /^(.+):replay:\d+$/.exec(id);
    if (m === null) return id;
    id = m[1];
  }
}

function payloads(): Promise<ObjectStore> {
  payloadStore ??= (async () => {
    const objm = new Objm(nc);
    try {
      return await objm.open(PAYLOADS);
    } catch {
      return await objm.create(PAYLOADS, { ttl: 7 * DAY_MS * NS, storage: StorageType.File });
    }
  })();
  payloadStore.catch(() => { payloadStore = undefined; }); // try again next time
  return payloadStore;
}

// openRegistry binds the registry bucket, creating it if missing (§8).
async function openRegistry(): Promise<KV> {
  const kvm = new Kvm(nc);
  const jsm = await jetstreamManager(nc);
  const exists = await jsm.streams.info(`KV_${REGISTRY}`).then(() => true, () => false);
  if (exists) return kvm.open(REGISTRY); // never changed once created
  return kvm.create(REGISTRY, { history: 1, markerTTL: 7 * DAY_MS, storage: StorageType.File });
}

// announce writes this instance's registry record with a per-key TTL of
// three heartbeats: a KV put would drop the TTL, so it publishes (§8).
async function announce(status: string): Promise<void> {
  const concurrency = PRIORITIES.length; // one reader per priority, one message at a time each
  if (status === "READY" && inFlight >= concurrency - 1) status = "BUSY";
  const record = {
    id: ID, instance: INSTANCE, type: "typescript", version: "1",
    capabilities: [{ name: "conformance", actions: Object.keys(handlers) }],
    status, load: inFlight / concurrency, in_flight: inFlight, concurrency, last_heartbeat: new Date().toISOString(),
  };
  const ttl = `${Math.max(1, Math.ceil((3 * HEARTBEAT_MS) / 1000))}s`;
  await js.publish(`$KV.${REGISTRY}.agent.${ID}.${INSTANCE}`, JSON.stringify(record), { ttl });
}

// heartbeat renews the record and publishes the core heartbeat (§8).
async function heartbeat(): Promise<void> {
  try {
    await announce(stopping ? "STOPPING" : "READY");
    nc.publish(`${PREFIX}.hb.${ID}`, JSON.stringify({ at: new Date().toISOString(), id: ID, in_flight: inFlight, instance: INSTANCE }));
  } catch (e) {
    console.error(`${ID}: heartbeat: ${(e as Error).message}`);
  }
}

main().catch((e) => {
  console.error(`${ID}: ${(e as Error).stack ?? e}`);
  process.exit(1);
});
