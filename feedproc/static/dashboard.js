// feedproc dashboard: refresh the live part of the page, and send retry/cancel with the API token.
// Server-rendered (escaped) HTML is swapped in; anything this script writes itself uses textContent.
(function () {
  "use strict";
  const TOKEN = "feedproc-api-token";
  const live = document.getElementById("live");
  const flash = document.getElementById("flash");
  const state = document.getElementById("live-state");
  const tokenInput = document.getElementById("token");
  const src = live.dataset.src;
  const every = parseInt(live.dataset.refresh || "2000", 10);

  tokenInput.value = sessionStorage.getItem(TOKEN) || "";
  tokenInput.addEventListener("input", () => sessionStorage.setItem(TOKEN, tokenInput.value.trim()));
  document.getElementById("token-form").addEventListener("submit", (e) => e.preventDefault());

  function say(text, kind) {
    flash.textContent = text;
    flash.className = kind || "";
  }

  let busy = false;
  async function refresh() {
    if (!src || busy) return;
    busy = true;
    try {
      const response = await fetch(src, { headers: { Accept: "text/html" }, cache: "no-store" });
      if (response.ok) {
        live.innerHTML = await response.text();
        state.className = "live-dot";
        state.textContent = "live";
      } else {
        state.className = "live-dot stale";
        state.textContent = "HTTP " + response.status;
      }
    } catch (error) {
      state.className = "live-dot stale";
      state.textContent = "offline";
    } finally {
      busy = false;
    }
  }

  async function act(button) {
    const key = button.dataset.key;
    const action = button.dataset.action;
    const token = tokenInput.value.trim();
    if (!token) {
      say("Enter the API token (FEEDPROC_API_TOKEN) to " + action + " partitions.", "error");
      tokenInput.focus();
      return;
    }
    if (action === "cancel" && !window.confirm("Cancel partition " + key + "?")) return;
    button.disabled = true;
    try {
      const response = await fetch("/api/v1/partitions/" + encodeURIComponent(key) + "/" + action, {
        method: "POST",
        headers: { Authorization: "Bearer " + token },
      });
      const body = await response.json().catch(() => ({}));
      if (response.ok) {
        say(action === "retry" ? "Retrying " + key + ": " + body.retried + " failed items are available again."
                               : "Cancelled " + key + ".", "ok");
      } else {
        say(action + " " + key + ": " + (body.error || "HTTP " + response.status), "error");
      }
    } catch (error) {
      say(action + " " + key + ": " + error, "error");
    } finally {
      button.disabled = false;
      refresh();
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) act(button);
  });
  if (src) setInterval(refresh, every);
})();
