// The ACL v1 envelope (PROTOCOL.md §4, schema/acl.schema.json): strict
// decoding and validation, and building replies (PROTOCOL.md §6).

import { randomUUID } from "node:crypto";

export const PRIORITIES = ["critical", "high", "normal", "low", "batch"] as const;
export type Priority = (typeof PRIORITIES)[number];

const TYPES = ["request", "response", "notification", "error", "ack"] as const;
export type MessageType = (typeof TYPES)[number];

// Error codes and whether a retry can help (PROTOCOL.md §6).
export const RETRYABLE: Record<string, boolean> = {
  TIMEOUT: true, UNAVAILABLE: true, BUSY: true, RATE_LIMIT: true, INTERNAL: true,
  INVALID: false, REJECTED: false, CAPABILITY_MISSING: false, NOT_FOUND: false, EXPIRED: false,
};

export type WireError = {
  code: string;
  message?: string;
  retryable: boolean;
  retry_after_ms?: number;
  details?: Record<string, unknown>;
};

export type Envelope = {
  acl: "1";
  message_id: string;
  message_type: MessageType;
  action?: string;
  priority: Priority;
  timestamp: string;
  ttl_ms?: number;
  sender_id: string;
  sender_type?: string;
  receiver_id?: string;
  receiver_type?: string;
  topic?: string;
  correlation_id?: string;
  workflow_id?: string;
  task_id?: string;
  session_id?: string;
  in_reply_to?: string;
  requires_ack?: boolean;
  status?: string;
  error?: WireError;
  payload?: unknown;
  context?: unknown;
  metadata?: Record<string, string>;
  trace?: { trace_id?: string; span_id?: string; parent_span?: string };
};

/** Thrown for anything that is not a valid v1 envelope. */
export class InvalidEnvelope extends Error {}

const TOKEN = /^[A-Za-z0-9_-]{1,64}$/;
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):([0-5]\d)(\.\d+)?(Z|[+-](\d{2}):(\d{2}))$/;
const MAX_TTL_MS = 9223372036854;
const SHORT = ["action", "status", "sender_type", "receiver_type", "correlation_id", "workflow_id", "task_id", "session_id", "in_reply_to"];
const MEMBERS = new Set(["acl", "message_id", "message_type", "action", "priority", "timestamp", "ttl_ms", "sender_id",
  "sender_type", "receiver_id", "receiver_type", "topic", "correlation_id", "workflow_id", "task_id", "session_id",
  "in_reply_to", "requires_ack", "status", "error", "payload", "context", "metadata", "trace"]);

export function isToken(s: string): boolean {
  return TOKEN.test(s);
}

/** Checks a message id: 1–256 characters, no whitespace or control characters. */
export function validMessageID(id: unknown): id is string {
  return typeof id === "string" && id.length > 0 && [...id].length <= 256 && !/[ \t\r\n]/.test(id) && !CONTROL.test(id);
}

/**
 * Decodes one envelope as strictly as PROTOCOL.md §1 asks: valid UTF-8,
 * no duplicate or unknown members, integers without fraction or exponent.
 */
export function decode(data: Uint8Array): Envelope {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(data);
  } catch {
    throw new InvalidEnvelope("invalid UTF-8");
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new InvalidEnvelope(`not JSON: ${(e as Error).message}`);
  }
  checkMembers(text);
  return validate(doc);
}

// checkMembers walks the JSON text (already known to parse) for what
// JSON.parse forgives: duplicate names, and ttl_ms or retry_after_ms
// written as 1.0 or 1e3.
function checkMembers(text: string): void {
  let i = 0;
  const ws = () => { while (" \t\r\n".includes(text[i])) i++; };
  const str = (): string => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const value = (path: string): void => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const seen = new Set<string>();
      for (ws(); text[i] !== "}"; ws()) {
        if (text[i] === ",") { i++; ws(); }
        const name = str();
        if (seen.has(name)) throw new InvalidEnvelope(`duplicate member "${name}"`);
        seen.add(name);
        ws(); i++; // the colon
        value(path === "" ? name : `${path}.${name}`);
        ws();
      }
      i++;
    } else if (c === "[") {
      i++;
      for (ws(); text[i] !== "]"; ws()) {
        if (text[i] === ",") i++;
        value(path + "[]");
      }
      i++;
    } else if (c === '"') {
      str();
    } else {
      const start = i;
      while (i < text.length && !",}] \t\r\n".includes(text[i])) i++;
      const lit = text.slice(start, i);
      if ((path === "ttl_ms" || path === "error.retry_after_ms") && /[.eE]/.test(lit)) {
        throw new InvalidEnvelope(`${path} ${lit} is not an integer`);
      }
    }
  };
  value("");
}

function fail(field: string, why: string): never {
  throw new InvalidEnvelope(`${field}: ${why}`);
}

/** Validates a parsed envelope against schema/acl.schema.json and the rules of PROTOCOL.md §4. */
export function validate(doc: unknown): Envelope {
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) fail("envelope", "not a JSON object");
  const e = doc as Record<string, unknown>;
  for (const k of Object.keys(e)) {
    if (!MEMBERS.has(k)) fail(k, "unknown member");
    if (e[k] === null || e[k] === "") delete e[k]; // null and "" read as absent
  }
  if (e.acl !== "1") fail("acl", `unsupported version ${JSON.stringify(e.acl)}`);
  if (!validMessageID(e.message_id)) fail("message_id", "1 to 256 characters without whitespace or control characters");
  if (!TYPES.includes(e.message_type as MessageType)) fail("message_type", "unknown type");
  if (e.priority === "medium") e.priority = "normal";
  if (!PRIORITIES.includes(e.priority as Priority)) fail("priority", "unknown priority");
  const ts = typeof e.timestamp === "string" ? TIMESTAMP.exec(e.timestamp) : null;
  if (!ts || Number.isNaN(Date.parse(e.timestamp as string)) || Number(ts[9] ?? 0) > 23 || Number(ts[10] ?? 0) > 59) {
    fail("timestamp", "not an RFC 3339 time");
  }
  if (e.ttl_ms !== undefined && (!Number.isInteger(e.ttl_ms) || (e.ttl_ms as number) < 0 || (e.ttl_ms as number) > MAX_TTL_MS)) {
    fail("ttl_ms", `an integer from 0 to ${MAX_TTL_MS}`);
  }
  if (typeof e.sender_id !== "string" || !isToken(e.sender_id)) fail("sender_id", "not a subject token");
  for (const f of ["receiver_id", "topic"]) {
    if (e[f] !== undefined && (typeof e[f] !== "string" || !isToken(e[f] as string))) fail(f, "not a subject token");
  }
  for (const f of SHORT) {
    const v = e[f];
    if (v !== undefined && (typeof v !== "string" || [...v].length > 256 || CONTROL.test(v))) {
      fail(f, "at most 256 characters without control characters");
    }
  }
  if (e.requires_ack !== undefined && typeof e.requires_ack !== "boolean") fail("requires_ack", "not a boolean");
  if (e.metadata !== undefined) {
    if (typeof e.metadata !== "object" || Array.isArray(e.metadata)) fail("metadata", "not an object");
    for (const [k, v] of Object.entries(e.metadata as object)) {
      if (v !== null && typeof v !== "string") fail(`metadata.${k}`, "not a string");
    }
  }
  if (e.trace !== undefined) {
    if (typeof e.trace !== "object" || Array.isArray(e.trace)) fail("trace", "not an object");
    for (const [k, v] of Object.entries(e.trace as object)) {
      if (!["trace_id", "span_id", "parent_span"].includes(k)) fail(`trace.${k}`, "unknown member");
      if (v !== null && typeof v !== "string") fail(`trace.${k}`, "not a string");
    }
  }
  if (e.error !== undefined) validateError(e.error);
  switch (e.message_type) {
    case "request":
    case "notification":
      if (e.action === undefined) fail("action", `required on ${e.message_type} messages`);
      break;
    case "response":
    case "ack":
      if (e.in_reply_to === undefined) fail("in_reply_to", `required on ${e.message_type} messages`);
      break;
    case "error":
      if (e.error === undefined) fail("error", "required on error messages");
  }
  return e as Envelope;
}

function validateError(err: unknown): void {
  if (typeof err !== "object" || err === null || Array.isArray(err)) fail("error", "not an object");
  const o = err as Record<string, unknown>;
  for (const [k, v] of Object.entries(o)) {
    if (!["code", "message", "retryable", "retry_after_ms", "details"].includes(k)) fail(`error.${k}`, "unknown member");
    if (v === null) continue;
    if (k === "message" && typeof v !== "string") fail("error.message", "not a string");
    if (k === "retryable" && typeof v !== "boolean") fail("error.retryable", "not a boolean");
    if (k === "retry_after_ms" && !Number.isInteger(v)) fail("error.retry_after_ms", "not an integer");
    if (k === "details" && (typeof v !== "object" || Array.isArray(v))) fail("error.details", "not an object");
  }
  if (typeof o.code !== "string" || !(o.code in RETRYABLE)) fail("error.code", "unknown code");
}

/** Reports whether e carries a ttl_ms that has passed (PROTOCOL.md §5 check 12). */
export function expired(e: Envelope, now = Date.now()): boolean {
  return (e.ttl_ms ?? 0) > 0 && now > Date.parse(e.timestamp) + e.ttl_ms!;
}

/** The envelope answering e from self (PROTOCOL.md §6): the ids it carries over. */
function reply(e: Envelope, self: string, type: MessageType, action: string | undefined): Envelope {
  const r: Envelope = {
    acl: "1", message_id: randomUUID(), message_type: type, action, priority: e.priority,
    timestamp: new Date().toISOString(), sender_id: self, receiver_id: e.sender_id, receiver_type: e.sender_type,
    in_reply_to: e.message_id, correlation_id: e.correlation_id ?? e.message_id, workflow_id: e.workflow_id,
    task_id: e.task_id, session_id: e.session_id, context: e.context,
  };
  const origin = e.metadata?.origin_sender;
  if (origin) {
    // A forwarded message: answer whoever sent the original.
    r.receiver_id = origin;
    r.receiver_type = undefined;
    r.in_reply_to = e.metadata?.origin_message_id;
  }
  return r;
}

export function newResponse(e: Envelope, self: string, action: string, payload: unknown): Envelope {
  return { ...reply(e, self, "response", action), status: "success", payload };
}

export function newErrorReply(e: Envelope, self: string, err: WireError): Envelope {
  return { ...reply(e, self, "error", e.action), status: err.retryable ? "failed" : "rejected", error: err };
}

export function newAck(e: Envelope, self: string, nack: WireError | undefined, processingMs: number): Envelope {
  return {
    ...reply(e, self, "ack", e.action), status: nack ? "NACK" : "ACK", error: nack,
    metadata: { processing_time_ms: String(Math.max(0, Math.round(processingMs))) },
  };
}

/** Encodes e, leaving out absent members as agentkit does. */
export function encode(e: Envelope): Uint8Array {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(e)) {
    if (v !== undefined && v !== null && v !== "") out[k] = v;
  }
  return new TextEncoder().encode(JSON.stringify(out));
}

/** The stub of a large envelope (PROTOCOL.md §7). */
export function stub(e: Envelope): Envelope {
  const s: Envelope = { ...e, payload: undefined, context: undefined, metadata: undefined };
  if (e.error) s.error = { code: e.error.code, retryable: e.error.retryable, retry_after_ms: e.error.retry_after_ms };
  return s;
}
