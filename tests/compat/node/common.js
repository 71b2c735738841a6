'use strict';
// Shared plumbing of the ali-ons driver scripts: read the JSON spec (argv[2]), build client
// options that point ali-ons at our registry, record every request ali-ons makes (code, header,
// answer) and print exactly one JSON document on stdout. Logs go to stderr.

const RemotingClient = require('ali-ons/lib/remoting_client');

const calls = [];
const errors = [];

function readSpec() {
  const raw = process.argv[2];
  if (!raw) {
    throw new Error('usage: node <script>.js \'<json spec>\'');
  }
  return JSON.parse(raw);
}

// Record each request and its answer. Patching the base class covers the name server and
// broker channels of every producer and consumer in this process.
function traceCalls() {
  const invoke = RemotingClient.prototype.invoke;
  RemotingClient.prototype.invoke = async function(addr, command, timeout) {
    const call = { addr: addr || 'registry', code: command.code, ext: null, resp: null, remark: null };
    calls.push(call);
    try {
      const response = await invoke.call(this, addr, command, timeout);
      call.resp = response.code;
      call.remark = response.remark || null;
      return response;
    } catch (err) {
      call.remark = `${err.name}: ${err.message}`;
      throw err;
    } finally {
      call.ext = command.extFields;       // filled from the custom header while encoding
    }
  };
  const oneway = RemotingClient.prototype.invokeOneway;
  RemotingClient.prototype.invokeOneway = async function(addr, command) {
    const call = { addr: addr || 'registry', code: command.code, ext: null, resp: 'oneway', remark: null };
    calls.push(call);
    try {
      return await oneway.call(this, addr, command);
    } finally {
      call.ext = command.extFields;
    }
  };
}

const stderrLogger = {
  info(...args) { if (process.env.SMARTGO_COMPAT_VERBOSE) console.error('[info]', ...args); },
  debug() {},
  warn(...args) { console.error('[warn]', ...args); },
  error(...args) { console.error('[error]', ...args); },
};

// ali-ons asks an HTTP endpoint for the name server list unless nameSrv is set; it still
// requires an httpclient object, which must never be used here.
const noHttp = {
  async request(url) {
    throw new Error(`ali-ons tried to fetch ${url}: nameSrv must be set`);
  },
};

function clientOptions(spec, extra) {
  const options = Object.assign({
    nameSrv: spec.nameSrv.split(';'),
    httpclient: noHttp,
    logger: stderrLogger,
    clientIP: '127.0.0.1',
    // no ONS credentials unless asked: then ali-ons adds AccessKey, Signature and OnsChannel
    // to every request's extFields, which a broker without ACL ignores (secretKey: another secret)
  }, extra);
  if (spec.credentials) {
    options.accessKeyId = 'compat-access-key';
    options.accessKeySecret = spec.secretKey || 'compat-secret-key';
  }
  if (spec.instanceName) {
    options.instanceName = spec.instanceName;
  }
  return options;
}

function recordError(err) {
  errors.push(`${err && err.name}: ${err && err.message}`);
}

function messageToJson(msg) {
  const properties = Object.assign({}, msg.properties);
  delete properties[''];          // ali-ons' parser turns the trailing separator into an empty key
  return {
    msgId: msg.msgId,
    topic: msg.topic,
    tags: msg.tags,
    keys: msg.keys,
    properties,
    body: msg.body ? msg.body.toString('base64') : '',
    queueId: msg.queueId,
    queueOffset: msg.queueOffset,
    commitLogOffset: msg.commitLogOffset,
    sysFlag: msg.sysFlag,
    bodyCRC: msg.bodyCRC,
    storeSize: msg.storeSize,
    bornHost: msg.bornHost,
    storeHost: msg.storeHost,
    bornTimestamp: msg.bornTimestamp,
    storeTimestamp: msg.storeTimestamp,
    reconsumeTimes: msg.reconsumeTimes,
    flag: msg.flag,
  };
}

function emit(result) {
  result.calls = calls;
  result.errors = errors.concat(result.errors || []);
  process.stdout.write(JSON.stringify(result) + '\n');
}

// Run main(spec) and exit: 0 with its JSON result, 1 with {"fatal": ...} (still JSON). The spec's
// deadlineMs bounds the whole run, so a hung client still answers.
function run(main) {
  traceCalls();
  const fail = err => {
    emit({ fatal: `${err.name}: ${err.message}`, stack: err.stack });
    process.exit(1);
  };
  let spec;
  try {
    spec = readSpec();
  } catch (err) {
    fail(err);
  }
  setTimeout(() => fail(new Error(`script deadline of ${spec.deadlineMs || 60000} ms passed`)),
    spec.deadlineMs || 60000);
  main(spec).then(result => {
    emit(result);
    process.exit(0);
  }, fail);
}

module.exports = { clientOptions, emit, messageToJson, recordError, run };
