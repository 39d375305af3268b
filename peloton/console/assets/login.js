"use strict";
(function () {
  // a one-time link of `peloton cluster ui-login`: its code is in the fragment (never sent to a server); posted
  // once, then taken out of the address bar and the history
  const once = /^#once=([0-9a-f]{8}\.[A-Za-z0-9_-]{43})$/.exec(location.hash);
  if (once) {
    history.replaceState(null, "", "/login");
    document.getElementById("once-code").value = once[1];
    document.getElementById("once").submit();
    return;
  }
  // the page asked for without a session (the server sent the browser here): the login goes there
  const query = new URLSearchParams(location.search);
  const next = query.get("next") || "";
  for (const field of document.querySelectorAll('input[name="next"]')) field.value = next;
  const why = query.get("failed");
  if (why) {
    const p = document.getElementById("failed");
    p.textContent = why === "unknown" ? "This daemon does not know that token (revoked, or for another cluster)."
      : why === "denied" ? "That token's principal has no role here: an admin gives it one (peloton token create NAME --role viewer)."
      : why === "nocert" ? "Your browser presented no client certificate."
      : why === "certdenied" ? "Your client certificate's name has no role here: an admin gives it one in the principals file."
      : why === "expired" ? "That one-time link has expired: run peloton cluster ui-login again."
      : why === "once" ? "That one-time link was used already or is not one: run peloton cluster ui-login again."
      : "That is not a token: tokens look like pt_… (peloton token create).";
    p.hidden = false;
  }
  fetch("/api/login", { credentials: "same-origin" }).then((r) => r.json()).then((o) => {
    // a browser that has a session after all goes back at once: a link from another site sends no cookie (it is
    // SameSite=Strict, sent only with this console's own requests, as this one)
    // (only to a page of this console: "/\\evil.example" starts with one slash, and is another site to a browser)
    const to = new URL(next || "/", location.origin);
    if (o.session && !why && next && to.origin === location.origin) { location.replace(to.pathname + to.search); return; }
    if (o.certificate) {
      document.getElementById("certificate-name").textContent = o.certificate;
      document.getElementById("certificate").hidden = false;
    }
  }).catch(() => {});
})();
