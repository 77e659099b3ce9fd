// The published toxiproxy-node-client, unmodified, against `faultrig proxy --api`: run by
// tests/it/node.rs as `node toxiproxy_client.js API_ADDR ECHO_ADDR` with the package installed
// by scripts/test.sh. Timings are what a Toxiproxy user's test would assert; it exits non-zero
// (with the reason) on the first one that does not hold. Then every case of the toxic matrix
// (tests/toxiproxy/matrix.json), all at once, each on its own proxy.
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const net = require("net");
const path = require("path");
const { Toxiproxy } = require("toxiproxy-node-client");

const [api, echo] = process.argv.slice(2);
const toxiproxy = new Toxiproxy(`http://${api}`);

function fail(why) {
  console.error(`toxiproxy_client.js: ${why}`);
  process.exit(1);
}

// Opens a connection; `exchange()` sends 64 bytes and resolves with the round trip in ms once
// the same 64 bytes are back.
function connect(addr) {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), addr.slice(addr.lastIndexOf(":") + 1)];
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port: Number(port), noDelay: true }, () => {
      let pending = null;
      let got = Buffer.alloc(0);
      socket.on("data", (d) => {
        got = Buffer.concat([got, d]);
        if (pending && got.length >= 64) {
          const { start, sent, done } = pending;
          pending = null;
          if (!got.subarray(0, 64).equals(sent)) fail("the echo came back changed");
          got = got.subarray(64);
          done(Number(process.hrtime.bigint() - start) / 1e6);
        }
      });
      const exchange = () =>
        new Promise((done) => {
          const sent = Buffer.alloc(64, Math.floor(Math.random() * 256));
          pending = { start: process.hrtime.bigint(), sent, done };
          socket.write(sent);
        });
      resolve({ socket, exchange });
    });
    socket.on("error", reject);
  });
}

function within(what, ms, low, high) {
  if (!(ms >= low && ms < high)) fail(`${what}: ${ms.toFixed(1)} ms, expected [${low}, ${high})`);
  console.log(`${what}: ${ms.toFixed(1)} ms`);
}

(async () => {
  const version = await toxiproxy.getVersion();
  if (!String(version).includes("faultrig")) fail(`version ${version}`);
  const proxy = await toxiproxy.createProxy({ name: "node", listen: "127.0.0.1:0", upstream: echo });
  if (proxy.listen.endsWith(":0")) fail(`the bound port is not reported: ${proxy.listen}`);

  // Toxicity 0: present, never applied.
  const never = await proxy.addToxic({ name: "never", type: "latency", stream: "downstream", toxicity: 0, attributes: { latency: 500 } });
  let c = await connect(proxy.listen);
  within("toxicity 0", await c.exchange(), 0, 100);
  await never.remove();
  c.socket.destroy();

  // A 100 ms downstream latency toxic: the first exchange of a new connection and later ones
  // take 100 ms (Toxiproxy charges a new connection nothing).
  const latency = await proxy.addToxic({ type: "latency", stream: "downstream", toxicity: 1, attributes: { latency: 100, jitter: 0 } });
  c = await connect(proxy.listen);
  within("first exchange under 100 ms", await c.exchange(), 100, 170);
  within("later exchange under 100 ms", await c.exchange(), 100, 170);

  // Updated and removed on the live connection.
  await latency.update({ attributes: { latency: 200, jitter: 0 }, toxicity: 1 });
  within("after the update to 200 ms", await c.exchange(), 200, 290);
  await latency.remove();
  within("after the removal", await c.exchange(), 0, 100);

  c.socket.destroy();
  await proxy.remove();

  const { cases } = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "toxiproxy", "matrix.json"), "utf8"));
  const start = process.hrtime.bigint();
  const failures = (await Promise.all(cases.map((k) => runCase(k).then(() => null, (e) => `${k.name}: ${e.message || e}`)))).filter((f) => f);
  if (failures.length) fail(failures.join("\n"));
  console.log(`matrix: ${cases.length} cases in ${(Number(process.hrtime.bigint() - start) / 1e9).toFixed(1)} s`);
  console.log("ok");
})().catch((e) => fail(String(e && e.stack || e)));

// The toxic matrix (tests/toxiproxy/matrix.json says what each check means): each case on its
// own proxy, all at once.

const now = () => Number(process.hrtime.bigint()) / 1e6;

// A connection that queues what arrives, and how it ended ("fin", "reset", or null: open).
function open(addr) {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), addr.slice(addr.lastIndexOf(":") + 1)];
  return new Promise((resolve, reject) => {
    const conn = { got: Buffer.alloc(0), end: null, wake: null, opened: now() };
    const socket = net.connect({ host, port: Number(port), noDelay: true, allowHalfOpen: true }, () => resolve(conn));
    conn.socket = socket;
    const wake = () => { if (conn.wake) { const w = conn.wake; conn.wake = null; w(); } };
    socket.on("data", (d) => { conn.got = Buffer.concat([conn.got, d]); wake(); });
    socket.on("end", () => { conn.end = conn.end || "fin"; wake(); });
    socket.on("error", (e) => {
      if (!conn.end) conn.end = e.code === "ECONNRESET" ? "reset" : `error ${e.code}`;
      wake();
      reject(e);
    });
  });
}

// Waits until `done(conn)` holds, or `ms` pass (then resolves false).
function until(conn, done, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => { conn.wake = null; resolve(false); }, ms);
    const poll = () => {
      if (done(conn)) { clearTimeout(timer); resolve(true); } else conn.wake = poll;
    };
    poll();
  });
}

async function check(conn, want, what) {
  const within = (ms, label) => {
    if (!(ms >= want.min_ms && ms < want.max_ms)) throw new Error(`${what}: ${label} ${ms.toFixed(1)} ms, expected [${want.min_ms}, ${want.max_ms})`);
  };
  const take = (n) => { const b = conn.got.subarray(0, n); conn.got = conn.got.subarray(n); return b; };
  const ended = () => conn.end !== null;
  switch (want.check) {
    case "exchange":
    case "transfer": {
      const rounds = want.check === "exchange" ? ["first exchange", "later exchange"] : ["transfer"];
      for (const label of rounds) {
        const sent = crypto.randomBytes(want.check === "exchange" ? 64 : want.bytes);
        const start = now();
        conn.socket.write(sent);
        if (!(await until(conn, (c) => c.got.length >= sent.length || ended(), 20000)) || conn.got.length < sent.length) {
          throw new Error(`${what}: ${conn.got.length} of ${sent.length} bytes, then ${conn.end}`);
        }
        within(now() - start, label);
        if (!take(sent.length).equals(sent)) throw new Error(`${what}: bytes lost or changed`);
      }
      break;
    }
    case "limited": {
      const sent = crypto.randomBytes(2 * want.bytes);
      conn.socket.write(sent);
      await until(conn, ended, 20000);
      if (!conn.got.equals(sent.subarray(0, want.bytes))) throw new Error(`${what}: ${conn.got.length} bytes came back`);
      if (conn.end !== "fin") throw new Error(`${what}: ended with ${conn.end}`);
      break;
    }
    case "reset": {
      const start = now();
      conn.socket.write("hello");
      await until(conn, ended, 20000);
      if (conn.end !== "reset") throw new Error(`${what}: ended with ${conn.end}, not a reset`);
      if (now() - start < want.min_ms) throw new Error(`${what}: reset after ${(now() - start).toFixed(1)} ms`);
      break;
    }
    case "closed": {
      // The toxic's timer starts when the proxy takes the connection: timed from the connect.
      conn.socket.write("lost");
      await until(conn, ended, 20000);
      if (conn.got.length || conn.end !== "fin") throw new Error(`${what}: ${conn.got.length} bytes, ended with ${conn.end}`);
      within(now() - conn.opened, "closed");
      break;
    }
    case "ends": {
      await until(conn, ended, want.max_ms);
      if (conn.got.length || conn.end !== "fin") throw new Error(`${what}: ${conn.got.length} bytes, ended with ${conn.end}`);
      break;
    }
    case "dropped": {
      conn.socket.write("lost");
      if (await until(conn, (c) => c.got.length > 0 || ended(), want.ms)) throw new Error(`${what}: ${conn.got.length} bytes came through, ended ${conn.end}`);
      break;
    }
    case "slow_close": {
      conn.socket.write("bye");
      const start = now();
      conn.socket.end();
      await until(conn, ended, 20000);
      if (conn.got.toString() !== "bye" || conn.end !== "fin") throw new Error(`${what}: ${JSON.stringify(conn.got.toString())}, ended with ${conn.end}`);
      within(now() - start, "end");
      break;
    }
    default:
      throw new Error(`unknown check ${want.check}`);
  }
}

const ENDING = new Set(["limited", "reset", "closed", "ends", "slow_close"]);

async function runCase(k) {
  const proxy = await toxiproxy.createProxy({ name: `node-${k.name}`, listen: "127.0.0.1:0", upstream: echo });
  try {
    const toxic = await proxy.addToxic({ ...k.toxic, name: "t" });
    let conn = await open(proxy.listen);
    await check(conn, k.expect, k.name);
    if (k.update) {
      await toxic.update(k.update);
      await check(conn, k.after_update, `${k.name} after the update`);
    }
    if (k.after_removal) {
      await toxic.remove();
      if (ENDING.has(k.expect.check)) {
        conn.socket.destroy();
        conn = await open(proxy.listen);
      }
      await check(conn, k.after_removal, `${k.name} after the removal`);
    }
    conn.socket.destroy();
  } finally {
    await proxy.remove();
  }
}
