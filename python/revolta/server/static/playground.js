// The playground: a chat over /v1/chat/completions (streamed), with sampling controls, an image
// attachment (sent as a data URL), a stop button and a tokens/s readout. No build step: plain
// browser JavaScript.
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function add(role, text, image) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  if (image) {
    const img = document.createElement("img");
    img.src = image;
    img.alt = "attached image";
    div.prepend(img);
  }
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    $("model").replaceChildren(...body.data.map((m) => new Option(m.id, m.id)));
    $("status").textContent = `ready: ${body.data[0].id}, context ${body.data[0].max_model_len} tokens`;
  } catch (e) {
    $("status").textContent = `cannot list models: ${e.message}`;
  }
}

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// The attached image as a data URL (null: none).
function readImage() {
  const file = $("image").files[0];
  if (!file) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function send(text, image) {
  const content = image ? [{ type: "image_url", image_url: { url: image } }, { type: "text", text }] : text;
  history.push({ role: "user", content });
  add("user", text, image);
  const out = add("assistant", "");
  out.dataset.state = "streaming";
  const system = $("system").value.trim();
  const body = {
    model: $("model").value, stream: true, stream_options: { include_usage: true },
    messages: system ? [{ role: "system", content: system }, ...history] : history,
    temperature: number("temperature"), top_p: number("top-p"), max_tokens: number("max-tokens"), seed: number("seed"),
  };
  controller = new AbortController();
  busy(true);
  const start = performance.now();
  let first = null, tokens = 0, usage = null, finish = null;
  const show = () => {
    const secs = (performance.now() - (first || start)) / 1000;
    const n = usage ? usage.completion_tokens : tokens;
    const rate = first && secs > 0 ? (n / secs).toFixed(1) : "-";
    $("status").textContent = `${n} tokens, ${rate} tok/s` +
      (first ? `, first token after ${Math.round(first - start)} ms` : "") + (finish ? `, ${finish}` : "");
  };
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                   signal: controller.signal });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      throw new Error(err.error ? err.error.message : `HTTP ${r.status}`);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const chunk = JSON.parse(line.slice(6));
          if (chunk.usage) usage = chunk.usage;
          for (const c of chunk.choices || []) {
            if (c.delta && c.delta.content) {
              if (first === null) first = performance.now();
              out.textContent += c.delta.content;
              tokens += 1;
            }
            if (c.finish_reason) finish = c.finish_reason;
          }
          show();
          $("log").scrollTop = $("log").scrollHeight;
        }
      }
    }
    out.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
      out.dataset.state = "stopped";
    } else {
      out.className = "msg error";
      out.textContent = e.message;
      out.dataset.state = "error";
    }
  } finally {
    history.push({ role: "assistant", content: out.textContent });
    controller = null;
    busy(false);
    show();
  }
}

$("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  const image = await readImage();
  $("image").value = "";
  send(text, image);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("log").replaceChildren();
});
$("api-key").value = localStorage.getItem("revolta-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("revolta-api-key", $("api-key").value.trim());
  loadModels();
});
loadModels();
