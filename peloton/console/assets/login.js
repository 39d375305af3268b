"use strict";
(function () {
  const why = new URLSearchParams(location.search).get("failed");
  if (!why) return;
  const p = document.getElementById("failed");
  p.textContent = why === "unknown" ? "This daemon does not know that token (revoked, or for another cluster)."
    : why === "denied" ? "That token's principal has no role here: an admin gives it one (peloton token create NAME --role viewer)."
    : "That is not a token: tokens look like pt_… (peloton token create).";
  p.hidden = false;
})();
