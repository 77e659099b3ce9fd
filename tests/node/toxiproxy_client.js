// The published toxiproxy-node-client, unmodified, against `faultrig proxy --api`: run by
// tests/it/node.rs as `node toxiproxy_client.js API_ADDR ECHO_ADDR` with the package installed
// by scripts/test.sh. Timings are what a Toxiproxy user's test would assert; it exits non-zero
// (with the reason) on the first one that does not hold.
"use strict";
const net = require("net");
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
  console.log("ok");
})().catch((e) => fail(String(e && e.stack || e)));
