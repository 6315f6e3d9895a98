//! The words of the tracker. Kept apart from the generator so the story can be
//! edited without touching the sampling logic, and so the lists can be checked
//! by tests (enough phrasings per cause, no auth vocabulary in filler).

/// Text for one root cause of a new-auth-path failure. Causes are indexed like
/// [`super::CAUSES`].
pub(super) struct CauseText {
    /// Titles that name the mechanism, as an engineer who debugged it writes.
    pub specific_titles: &'static [&'static str],
    /// Titles that only describe the symptom, as a customer or support writes;
    /// these force a reader to open the body.
    pub vague_titles: &'static [&'static str],
    /// Quotable statements of the cause. Every true blocker carries one.
    pub sentences: &'static [&'static str],
    pub symptoms: &'static [&'static str],
    pub steps: &'static [&'static [&'static str]],
    /// `LEVEL target: message`; the renderer prefixes timestamps.
    pub logs: &'static [&'static str],
    pub fix_notes: &'static [&'static str],
}

pub(super) const CAUSE_TEXT: [CauseText; 6] = [
    // token_refresh_race
    CauseText {
        specific_titles: &[
            "Refresh token rotated twice",
            "Concurrent token refresh invalidates the session (auth/v2)",
            "Race in auth/v2 refresh: parallel refreshes revoke each other's refresh token",
            "invalid_grant on refresh when two refreshes overlap",
            "Token refresh race logs users out",
            "auth/v2: reuse detection fires on legitimate concurrent refreshes",
        ],
        vague_titles: &[
            "Users randomly logged out on 3.0 RC",
            "Intermittent 401s after ~15 minutes in the web app",
            "Kicked out of the dashboard while working",
            "Mobile app forces re-login several times a day",
            "Session dies when the laptop wakes from sleep",
            "Random logouts with new_auth_path enabled",
            "`invalid_grant` errors in production logs since rc.2",
            "Long-running export fails halfway with 401",
        ],
        sentences: &[
            "The refresh token is rotated twice when two tabs refresh concurrently, so the second tab ends up holding a revoked token.",
            "Two concurrent calls to `/auth/v2/token/refresh` race: the first one rotates the refresh token and the second one presents the already-invalidated token, which logs the user out.",
            "It is a race in `auth/v2/refresh.rs`: when the access token expires while several requests are in flight, each of them triggers its own refresh and all but one get `invalid_grant`.",
            "Root cause: token refresh in the new auth path is not serialized, so parallel refreshes invalidate each other's refresh token.",
            "When the background sync and the UI refresh the token at the same moment, the new auth service treats the second refresh as token reuse, revokes the whole token family and the session dies.",
            "The mobile app and the web app share one refresh token, and whichever refreshes second is rejected because the rotation already happened.",
            "Our proxy retries the refresh request after a timeout, and the retry reuses a refresh token that the first attempt already rotated, so auth/v2 revokes the session.",
            "It only happens when the access token expires while two requests are in flight: both try to refresh, the loser gets a 401 and the client forces a logout.",
        ],
        symptoms: &[
            "Since we enabled `new_auth_path` on staging, users get bounced to the login page in the middle of their work.",
            "Several customers report being logged out every 15-20 minutes, usually right around the time the access token expires.",
            "Support has a dozen tickets about sudden logouts since 3.0.0-rc.2.",
            "With two browser tabs open, one of them shows \"Your session has expired\" after a while.",
            "The mobile app asks for credentials again several times a day, which never happened on 2.9.",
            "Long-running exports fail with `401 Unauthorized` somewhere in the middle.",
        ],
        steps: &[
            &[
                "Enable `new_auth_path` for the tenant",
                "Log in and open the dashboard in two tabs",
                "Wait until the access token expires (15 min, or set `AUTH_V2_ACCESS_TTL=60s`)",
                "Click around in both tabs",
            ],
            &[
                "Log in on the web app",
                "Start a large CSV export",
                "Keep using the app while the export runs",
                "Watch the network tab when the access token expires",
            ],
            &[
                "Log in on the mobile app and the web app with the same account",
                "Leave both open for 20 minutes",
                "Use the mobile app",
            ],
        ],
        logs: &[
            "WARN auth::v2::refresh: refresh token reuse detected, revoking family fam_3f9a",
            "INFO auth::v2::refresh: rotated refresh token for user 48121",
            "INFO auth::v2::refresh: rotated refresh token for user 48121",
            "ERROR auth::v2::refresh: invalid_grant: refresh token already rotated",
            "WARN web::client: 401 on GET /api/v3/widgets, forcing logout",
            "DEBUG auth::v2::refresh: refresh requested by request_id=7c1e",
            "DEBUG auth::v2::refresh: refresh requested by request_id=7c1f",
        ],
        fix_notes: &[
            "Fixed by serialising refreshes per token family; verified on staging.",
            "Fixed in 3.0.0-rc.3: the client now shares a single in-flight refresh.",
            "Resolved by adding a 10 s grace window for the previous refresh token.",
        ],
    },
    // sso_redirect_loop
    CauseText {
        specific_titles: &[
            "OIDC callback redirects back to /login forever",
            "Infinite redirect loop between /login and /auth/v2/callback",
            "ERR_TOO_MANY_REDIRECTS on the new login flow",
            "SSO redirect loop after the OIDC callback",
            "New login flow loops back to the IdP",
        ],
        vague_titles: &[
            "Can't sign in with SSO after upgrading to 3.0.0-rc.2",
            "Login page keeps reloading",
            "Enterprise customers cannot log in",
            "Okta users stuck on a spinner after login",
            "Browser says the page isn't redirecting properly",
            "SSO broken for the Globex tenant",
            "Nobody at Initech can get into the app",
        ],
        sentences: &[
            "The OIDC callback redirects back to /login forever.",
            "After the IdP returns to `/auth/v2/callback`, the state check fails and the app sends the browser to `/login` again, which bounces to the IdP, in an endless loop.",
            "The callback handler loses the `state` cookie on Safari, so every SSO login comes back to the login page and starts over.",
            "With Okta the browser ping-pongs between `/login` and `/auth/v2/callback` until it hits ERR_TOO_MANY_REDIRECTS.",
            "The new login flow never marks the session as authenticated after the OIDC callback, so the auth guard redirects to the IdP again and again.",
            "The callback URL registered at the IdP has a trailing slash that the new auth path does not match, so the callback is treated as unauthenticated and the login flow restarts in a loop.",
            "Azure AD sign-in loops: callback, then /login, then the IdP, then the callback again, over and over.",
        ],
        symptoms: &[
            "SSO users cannot get past the login screen.",
            "After entering credentials at the IdP, the browser goes back and forth until Chrome gives up.",
            "The login page flashes and reloads about ten times a second.",
            "Customers on Okta and Azure AD report that they cannot reach the dashboard at all.",
            "Firefox shows \"The page isn't redirecting properly\" right after the IdP consent screen.",
        ],
        steps: &[
            &[
                "Configure an OIDC connection (Okta developer tenant is enough)",
                "Enable `new_auth_path`",
                "Open https://app.acme.io and click \"Continue with SSO\"",
                "Authenticate at the IdP",
            ],
            &[
                "Use Safari 17 with default privacy settings",
                "Start SSO login from the new login page",
                "Complete MFA at the IdP",
            ],
            &[
                "Register `https://app.acme.io/auth/v2/callback/` (with trailing slash) at the IdP",
                "Log in via SSO",
            ],
        ],
        logs: &[
            "INFO auth::v2::oidc: redirecting to issuer https://acme.okta.com/oauth2/default",
            "WARN auth::v2::callback: state mismatch (cookie missing), restarting login",
            "INFO web::router: GET /login -> 302 /auth/v2/authorize",
            "INFO web::router: GET /auth/v2/callback?code=... -> 302 /login",
            "WARN auth::v2::guard: unauthenticated request to /dashboard, redirecting to /login",
            "ERROR web::edge: redirect limit exceeded for client 10.2.4.17",
        ],
        fix_notes: &[
            "Fixed: the callback now normalises trailing slashes.",
            "Fixed in 3.0.0-rc.3 by storing the OIDC state server-side.",
            "Verified fixed on staging with Okta and Azure AD.",
        ],
    },
    // session_cookie_scope
    CauseText {
        specific_titles: &[
            "Session cookie scoped to the wrong domain",
            "Session cookie not sent to app.acme.io",
            "auth/v2 session cookie has the wrong scope",
            "New auth path: session cookie invisible outside the auth host",
        ],
        vague_titles: &[
            "Logged out immediately after a successful login",
            "Dashboard says \"Please sign in\" right after signing in",
            "API returns 401 for logged-in users",
            "Login succeeds but the app shows an anonymous user",
            "Can't stay signed in on app.eu.acme.io",
            "Reports page treats me as a guest",
        ],
        sentences: &[
            "The session cookie is scoped to auth.acme.io instead of .acme.io, so app.acme.io never sees it.",
            "The `Set-Cookie` header from the new auth service has `Domain=auth.acme.io`, therefore the dashboard on app.acme.io never receives the session.",
            "The session cookie is issued with `Path=/auth/v2`, so the browser does not send it with any request outside the auth endpoints.",
            "Because the new auth path sets the cookie for the login host only, the session exists on auth.acme.io and every other subdomain sees an anonymous user.",
            "The cookie domain comes from `AUTH_V2_COOKIE_DOMAIN`, which defaults to the auth host rather than the parent domain, so the session is invisible to the API host.",
            "Logging in works on auth.acme.io, but api.acme.io receives requests without any session cookie: the cookie is bound to the wrong domain.",
            "On the EU deployment the session cookie is scoped to auth.eu.acme.io, so app.eu.acme.io treats every request as logged out.",
        ],
        symptoms: &[
            "The login itself succeeds, but the dashboard immediately shows the sign-in prompt again.",
            "Every API call from the web app returns 401 even though the user just logged in.",
            "Users land on the dashboard as \"Guest\" after logging in.",
            "The EU tenants cannot use the app at all with the flag on.",
        ],
        steps: &[
            &[
                "Enable `new_auth_path`",
                "Log in at https://auth.acme.io/login",
                "Get redirected to https://app.acme.io/dashboard",
                "Observe the sign-in prompt",
            ],
            &[
                "Log in",
                "Open devtools > Application > Cookies",
                "Compare the cookies for auth.acme.io and app.acme.io",
            ],
        ],
        logs: &[
            "INFO auth::v2::session: issued session for user 5512 (Domain=auth.acme.io; Path=/)",
            "WARN api::middleware: no session cookie on request to /api/v3/me",
            "INFO web::router: GET /dashboard -> 302 /login (anonymous)",
            "DEBUG auth::v2::config: cookie_domain=auth.acme.io (from default)",
        ],
        fix_notes: &[
            "Fixed: cookie domain now defaults to the parent domain.",
            "Fixed in 3.0.0-rc.3 (Path=/ and Domain=.acme.io).",
        ],
    },
    // clock_skew
    CauseText {
        specific_titles: &[
            "ID token rejected: \"token used before issued\"",
            "auth/v2 JWT validation has no clock leeway",
        ],
        vague_titles: &[
            "Logins fail on some nodes but not others",
            "Login fails for roughly a third of attempts",
        ],
        sentences: &[
            "The new auth service rejects ID tokens whose `iat` is a few seconds in the future; our IdP's clock runs about 4 s ahead, so logins fail with `token used before issued`.",
            "There is no leeway for clock skew in the `auth/v2` JWT validation, so nodes whose clocks drift by a couple of seconds reject valid tokens.",
            "auth/v2 compares `nbf` against the local clock with zero tolerance, and two of our pods are 3 s behind, so every login routed to them fails.",
        ],
        symptoms: &[
            "About one in three logins fails with a generic error page.",
            "Login works or fails depending on which pod handles the callback.",
        ],
        steps: &[&[
            "Enable `new_auth_path`",
            "Log in repeatedly (10-20 times)",
            "Note which pod served the failing callback",
        ]],
        logs: &[
            "ERROR auth::v2::jwt: validation failed: token used before issued (iat=1737465605, now=1737465602)",
            "WARN auth::v2::jwt: nbf in the future by 3s, rejecting",
        ],
        fix_notes: &["Fixed by allowing 60 s of leeway."],
    },
    // scope_mapping
    CauseText {
        specific_titles: &[
            "Group to scope mapping is case sensitive in auth/v2",
            "billing:write scope dropped on login with new_auth_path",
        ],
        vague_titles: &[
            "Admins lose access to settings with new_auth_path",
            "Finance team can't save invoices anymore",
        ],
        sentences: &[
            "The new auth path maps the IdP group `widget-admins` to the `read` scope instead of `admin`, so admins lose access to settings.",
            "OAuth scopes are not mapped back to roles in `auth/v2/scopes.rs`: `billing:write` is silently dropped, so finance users cannot save invoices.",
            "The scope mapping table in the new auth service is case-sensitive, so `Admin` from the directory sync maps to no scope at all.",
        ],
        symptoms: &[
            "Administrators see read-only settings pages after switching to the new login.",
            "Users with billing rights get 403 when saving invoices.",
        ],
        steps: &[&[
            "Enable `new_auth_path`",
            "Log in as a member of the admin group",
            "Open Settings > Workspace",
        ]],
        logs: &[
            "WARN auth::v2::scopes: no mapping for group \"Admin\"",
            "INFO auth::v2::scopes: granted scopes [read] to user 771",
            "WARN api::authz: 403 for PUT /api/v3/invoices/INV-2291 (missing billing:write)",
        ],
        fix_notes: &["Fixed: mapping is now case-insensitive."],
    },
    // other
    CauseText {
        specific_titles: &[
            "new_auth_path login hard-codes auth.acme.io (on-prem broken)",
            "auth/v2 logs password reset tokens in plaintext",
            "SSO redirects counted as failed logins, accounts locked",
        ],
        vague_titles: &[
            "On-prem install cannot log in after enabling the new flow",
            "Accounts locked after three SSO attempts",
        ],
        sentences: &[
            "The `new_auth_path` login page hard-codes `https://auth.acme.io`, so on-prem installations cannot log in at all.",
            "The new auth service writes the raw password reset token to the INFO log, which is a security hole we cannot ship.",
            "Rate limiting in `auth/v2` counts each OIDC redirect as a failed login and locks accounts after three attempts.",
        ],
        symptoms: &[
            "On-prem customers get a DNS error on the login page.",
            "Users are locked out after their third SSO login of the day.",
        ],
        steps: &[&["Enable `new_auth_path`", "Log in via the new login page"]],
        logs: &[
            "ERROR web::client: GET https://auth.acme.io/.well-known/openid-configuration failed: dns error",
            "WARN auth::v2::ratelimit: account 3317 locked after 3 failed attempts",
        ],
        fix_notes: &["Fixed in rc.3."],
    },
];

/// Ways a reporter says "this must block the release" when the label is set.
pub(super) const BLOCKER_STATEMENTS: &[&str] = &[
    "This is a release blocker for v3.0.",
    "We cannot ship 3.0 with this.",
    "Blocking the 3.0 release: every tenant with the flag on is affected.",
    "Marking as P0 / release-blocker, this breaks the core flow.",
    "Release blocker: there is no workaround for affected users.",
    "Adding to the 3.0 blocker list per the release sync.",
];

/// Blocker-ness stated only in prose, for true blockers missing the label.
pub(super) const UNLABELLED_BLOCKER_STATEMENTS: &[&str] = &[
    "This blocks the 3.0 release. I can't add labels, could a maintainer tag it?",
    "IMO this has to block 3.0; we can't turn the new auth path on for customers like this.",
    "Please treat this as a release blocker for 3.0.",
    "This should block the 3.0 release, I added it to the blocker list in the release doc.",
    "Per the release sync this is a blocker for v3.0 (label still missing).",
    "Blocker for 3.0: support can't roll the new login out to anyone until this is fixed.",
];

/// Appended to wrongly labelled non-blockers.
pub(super) const DOWNGRADE_NOTES: &[&str] = &[
    "**Update (triage):** downgrading, not a blocker. It only reproduces against the staging IdP.",
    "Edit: after discussion in the release sync this is not a blocker for 3.0; the label can go.",
    "Not a blocker after all: the workaround in the runbook is acceptable for 3.0. Downgrading to P2.",
    "Triage note: this only affects internal dev builds. Downgrading, not a release blocker.",
    "**Update:** not a blocker. Confirmed it only happens with a hand-edited config; closing the loop in the release doc.",
];

/// Wrongly labelled non-blockers about the new auth path. Each has a cause that
/// sounds real, then a reason why it is not a release problem.
pub(super) const NOISY_AUTH_TOPICS: &[(&str, &str)] = &[
    (
        "Login fails on my dev VM: token used before issued",
        "On my dev VM the clock was two minutes behind and the new auth service rejected the ID token. Fixing NTP on the VM solved it.",
    ),
    (
        "Refresh storms in the k6 load test against auth/v2",
        "Our k6 load test fires 500 refreshes per second with one shared refresh token, which the new auth path rejects as reuse. That is the intended reuse detection, the test script is wrong.",
    ),
    (
        "Redirect loop with the local Keycloak dev realm",
        "With the local Keycloak dev realm the new login flow loops between /login and the callback, because the realm's redirect URI is set to http://localhost:3000 while the app runs on port 8080.",
    ),
    (
        "New auth session cookie missing on localhost",
        "On localhost the new auth service sets the cookie for .acme.io, so it never appears on http://localhost. That is how the dev proxy is meant to be used (run it through dev.acme.io).",
    ),
    (
        "auth/v2 scope mapping warning in preview environments",
        "Preview environments log `no mapping for group \"qa\"` from the new auth path because the QA group is not in the preview config.",
    ),
];

pub(super) const NOISY_OTHER_TOPICS: &[(&str, &str, &str)] = &[
    (
        "area/billing",
        "Billing preview shows CHF amounts with the wrong currency symbol",
        "The plan preview renders `Fr.` instead of `CHF` for Swiss workspaces (Zürich office noticed it first).",
    ),
    (
        "area/search",
        "Reindex is slow on the staging cluster",
        "A full reindex takes 3 h on staging instead of 40 min; the staging cluster has half the nodes of production.",
    ),
    (
        "area/ui",
        "Chart tooltips overlap the legend on small screens",
        "On 1280x720 the tooltip covers the legend of the usage chart.",
    ),
    (
        "area/ci",
        "Flaky e2e test `exports_large_csv`",
        "The e2e test times out on the shared runners roughly once a day.",
    ),
];

/// Open, non-blocking issues about the new auth path: cosmetic, docs, feature
/// requests, low severity. Several use the same vocabulary as real causes.
pub(super) const AUTH_NOT_BLOCKER: &[(&str, &str, &str)] = &[
    (
        "cosmetic",
        "New login page: \"Continue with SSO\" button misaligned on Firefox",
        "On Firefox 126 the \"Continue with SSO\" button on the new login page sits 4px lower than the password field. Purely cosmetic.",
    ),
    (
        "cosmetic",
        "Typo on the new login page: \"credentails\"",
        "The error message on the auth/v2 login form says \"Invalid credentails\".",
    ),
    (
        "cosmetic",
        "Dark mode colours wrong on the /auth/v2 login form",
        "In dark mode the input borders on the new login form are nearly invisible. Not urgent.",
    ),
    (
        "cosmetic",
        "Login page logo blurry on retina screens",
        "The logo on the new login page is a 1x PNG. Would be nice to ship an SVG.",
    ),
    (
        "cosmetic",
        "Focus ring missing on the new sign-in button",
        "Keyboard users get no visible focus on the sign-in button of the new login flow.",
    ),
    (
        "cosmetic",
        "New login page footer links overlap on mobile",
        "On iPhone SE the \"Privacy\" and \"Terms\" links overlap on the auth/v2 login page.",
    ),
    (
        "docs",
        "Docs: migration guide for new_auth_path still mentions AUTH_V1_SECRET",
        "The migration guide says to set `AUTH_V1_SECRET`, which the new auth path ignores.",
    ),
    (
        "docs",
        "Document token refresh behaviour of auth/v2",
        "We should explain how refresh token rotation works in the new auth service, including what happens when two tabs refresh at once. Customers keep asking.",
    ),
    (
        "docs",
        "Add OIDC setup example for Keycloak",
        "The admin guide covers Okta and Azure AD but not Keycloak for the new login flow.",
    ),
    (
        "docs",
        "README: new_auth_path flag not listed in the configuration table",
        "The configuration table in the README is missing `new_auth_path` and `AUTH_V2_COOKIE_DOMAIN`.",
    ),
    (
        "docs",
        "Explain session cookie domain settings in the admin guide",
        "Self-hosted admins need to know how to set `AUTH_V2_COOKIE_DOMAIN` for their own domain; there is no page about it.",
    ),
    (
        "docs",
        "Changelog entry for the new authentication path is too vague",
        "The 3.0 changelog just says \"new login\"; it should link the auth/v2 docs.",
    ),
    (
        "feature",
        "Allow configuring refresh token lifetime in auth/v2",
        "Some customers want 8 h refresh tokens instead of 30 days. Feature request for the new auth service.",
    ),
    (
        "feature",
        "Remember the last used IdP on the new login page",
        "It would be nice if the new login page remembered which IdP I used last time.",
    ),
    (
        "feature",
        "Support PKCE for public clients in the new auth service",
        "The CLI is a public client; auth/v2 should support PKCE so we can drop the client secret.",
    ),
    (
        "feature",
        "Add metrics for login latency in auth/v2",
        "Expose a histogram `auth_v2_login_duration_seconds` so we can alert on slow IdPs.",
    ),
    (
        "feature",
        "Support multiple OIDC providers per tenant",
        "Large customers have two IdPs after a merger. The new auth path supports one per tenant.",
    ),
    (
        "feature",
        "SCIM provisioning on top of the new auth path",
        "Now that auth/v2 is OIDC based, SCIM provisioning would remove the manual user import.",
    ),
    (
        "low",
        "auth/v2 logs a deprecation warning on startup",
        "On startup the new auth service logs `jsonwebtoken: Validation::leeway is deprecated`. Harmless but noisy.",
    ),
    (
        "low",
        "New login flow: \"Forgot password\" link opens in the same tab",
        "Minor: the link should probably open in the same tab anyway, but it loses the `next` parameter.",
    ),
    (
        "low",
        "auth/v2: unnecessary second call to /userinfo on login",
        "The new auth path calls the IdP's /userinfo twice per login. Adds ~80 ms, low priority.",
    ),
    (
        "low",
        "Warning spam \"clock skew of 0s detected\" in auth/v2 logs",
        "Every login logs a WARN about a clock skew of 0 seconds. It is not actually a problem, the level should be DEBUG.",
    ),
    (
        "low",
        "auth/v2 health endpoint returns 200 before the JWKS cache is warm",
        "Only visible in the first second after boot; low severity.",
    ),
    (
        "low",
        "Redirect after login drops the URL fragment",
        "With new_auth_path the `#section` fragment is lost after the login redirect. Annoying but not blocking.",
    ),
    (
        "low",
        "New login page does not prefill the email from the invite link",
        "Invite links carry `?email=`; the new login form ignores it. Low severity.",
    ),
    (
        "low",
        "Audit log shows \"unknown\" IdP name for new-path logins",
        "The audit log entries written by auth/v2 have `idp: unknown`. Cosmetic for now.",
    ),
    (
        "feature",
        "Let admins force re-login for all users from the new auth settings",
        "Useful after an incident; the new auth settings page has no such button.",
    ),
    (
        "docs",
        "Sequence diagram for the OIDC callback in the architecture docs",
        "The architecture page still shows the legacy login. Add the /auth/v2/callback flow.",
    ),
    (
        "cosmetic",
        "Spinner on the new login page never stops when JavaScript is slow",
        "Only a visual glitch; the login still completes.",
    ),
    (
        "low",
        "auth/v2 rejects emails with a plus sign in the login hint",
        "`login_hint=jane+test@acme.io` is dropped; the user can still type it.",
    ),
];

/// Open release blockers in other areas.
pub(super) const OTHER_BLOCKERS: &[(&str, &str, &str)] = &[
    (
        "area/billing",
        "Invoices double-charged when the plan changes mid-cycle",
        "Upgrading from Team to Business on day 14 charges the full Business price plus the prorated difference.",
    ),
    (
        "area/billing",
        "Proration uses the wrong tax rate for EU customers",
        "The prorated line item uses the US tax rate (0 %) for EU workspaces, so invoices are wrong.",
    ),
    (
        "area/billing",
        "Stripe webhook retries create duplicate credits",
        "When Stripe retries `invoice.paid`, we credit the account again because the handler is not idempotent.",
    ),
    (
        "area/billing",
        "Usage-based billing ignores records ingested after midnight UTC",
        "The metering job cuts off at local midnight instead of UTC, dropping up to a day of usage.",
    ),
    (
        "area/billing",
        "Annual plans renew monthly after the 3.0 migration",
        "The migration sets `interval=month` for all plans.",
    ),
    (
        "area/search",
        "Search index corrupted after upgrade to 3.0 RC",
        "After the upgrade, queries return `segment checksum mismatch` for about 5 % of tenants.",
    ),
    (
        "area/search",
        "Reindex job OOMs on large tenants",
        "The reindex job loads the whole tenant into memory; tenants above 2 M records crash it.",
    ),
    (
        "area/search",
        "Search returns deleted records",
        "Deleted records keep showing up in results because the tombstone is never written to the new index.",
    ),
    (
        "area/search",
        "Filters on custom fields silently ignored",
        "Since the query parser rewrite, `field:value` filters on custom fields are dropped.",
    ),
    (
        "area/ci",
        "Release pipeline fails: signing step cannot find key",
        "The `sign-artifacts` job fails with `no secret key` since the runner migration.",
    ),
    (
        "area/ci",
        "arm64 build broken on main",
        "Linking fails on arm64 with `undefined reference to __aarch64_ldadd4_acq_rel`.",
    ),
    (
        "area/ci",
        "Nightly e2e suite red since the move to new runners",
        "All 212 e2e tests time out on the new runners; the browsers never start.",
    ),
    (
        "area/ci",
        "Helm chart publish step pushes to the wrong registry",
        "Charts for 3.0.0-rc.2 went to the staging registry; customers cannot pull them.",
    ),
    (
        "area/ui",
        "Dashboard crashes on load with more than 500 widgets",
        "The dashboard renders a white screen and the console shows `Maximum call stack size exceeded`.",
    ),
    (
        "area/ui",
        "Charts blank in Safari 17",
        "All charts render as empty boxes in Safari 17.4; the canvas size is 0x0.",
    ),
    (
        "area/ui",
        "Settings page white screen after saving",
        "Saving workspace settings throws `Cannot read properties of undefined (reading 'map')`.",
    ),
    (
        "area/ui",
        "Date picker off by one day for users west of UTC",
        "Choosing 2025-04-01 stores 2025-03-31 for users in America/Los_Angeles.",
    ),
    (
        "area/ui",
        "Keyboard navigation broken in the record table",
        "Arrow keys scroll the page instead of moving the selection; this is an accessibility regression we promised to fix for 3.0.",
    ),
    (
        "area/billing",
        "Credit notes PDF shows negative VAT twice",
        "Credit notes subtract VAT twice, so totals are wrong by the VAT amount.",
    ),
    (
        "area/search",
        "Highlighting breaks on non-ASCII text",
        "Queries for `Zürich` highlight the wrong characters (`Zür` shifted by one byte).",
    ),
    (
        "area/ci",
        "Docker image for 3.0 RC is 2.3 GB",
        "The release image accidentally includes the build cache; pulls time out for self-hosted customers.",
    ),
    (
        "area/ui",
        "Record detail view loses unsaved edits on tab switch",
        "Switching tabs in the record detail view discards edits without warning.",
    ),
];

/// Issues that mention login/auth/tokens only in passing; the real problem is
/// elsewhere. `(area label, title, body paragraph)`.
pub(super) const AUTH_IN_PASSING: &[(&str, &str, &str)] = &[
    (
        "area/ui",
        "After logging in, the usage chart shows yesterday's data",
        "Right after logging in, the usage chart on the home page shows yesterday's numbers until I refresh. The chart query uses the cached `from` date computed at page load, before midnight rolled over.",
    ),
    (
        "area/search",
        "Search suggestions flicker right after login",
        "After login the suggestion dropdown flickers for a second. It is the suggestions component re-rendering twice because the index-status poll and the first keystroke arrive together.",
    ),
    (
        "area/search",
        "Panic in search service (stack trace attached)",
        "The search service panics on an empty query string. The trace passes through the auth middleware because every request does, but the panic is in `search::query::parse`.",
    ),
    (
        "area/billing",
        "CSV export of API keys duplicates the token column header",
        "The admin export of API keys has the `token_prefix` header twice, which breaks our import script. The values are fine.",
    ),
    (
        "area/ui",
        "Welcome email after first login has a broken image",
        "The welcome email sent after the first login references `https://cdn.acme.io/img/welcome@2x.png`, which 404s.",
    ),
    (
        "area/billing",
        "Billing page shows the wrong plan for two seconds after login",
        "Right after login the billing page shows \"Free\" until the subscription request returns; we render before the data is loaded.",
    ),
    (
        "area/ui",
        "Notification badge count wrong after re-login",
        "After logging out and back in, the notification badge shows the old count. The badge store is never reset; nothing to do with the login itself.",
    ),
    (
        "area/ui",
        "\"Last login\" column in the admin user list uses the server time zone",
        "The admin user list shows last login times in UTC without saying so. It should use the viewer's time zone like every other table.",
    ),
    (
        "area/ui",
        "Avatar missing in the top bar after signing in",
        "The avatar URL is built from the user's email hash; for emails with uppercase letters the hash is wrong, so the image 404s.",
    ),
    (
        "area/search",
        "Saved searches lost when the auth token expires mid-edit",
        "If you leave the saved-search editor open for an hour, your draft is gone. The editor keeps drafts in component state only; it should persist them to local storage.",
    ),
    (
        "area/ci",
        "CI: GitHub token scope warning in the release workflow",
        "The release workflow logs `GITHUB_TOKEN has more scopes than needed`. Harmless, but the real failure in that run is the cache upload timing out.",
    ),
    (
        "area/ui",
        "Onboarding tour starts again on every login",
        "The tour completion flag is stored per device, not per account, so the onboarding tour restarts on every new browser.",
    ),
    (
        "area/billing",
        "Invoice emails sent twice to users with SSO accounts",
        "Users whose account was created through SSO get invoice emails twice. Their email appears in both `billing_contacts` and the owner field, and the mailer does not de-duplicate.",
    ),
    (
        "area/ui",
        "Dashboard slow on first load after sign-in",
        "The first dashboard load after sign-in takes 8 s. The profile shows 40 sequential widget queries; login itself takes 120 ms.",
    ),
    (
        "area/search",
        "Search permissions cache not refreshed after role change",
        "When an admin changes a user's role, search still uses the old permissions until the search cache expires (1 h). Logging out and back in does not help because the cache is server-side.",
    ),
    (
        "area/ui",
        "Stack trace in console on the records page",
        "The records page logs a TypeError in the console. The trace mentions `useAuth()` but the failing line is the column width calculation.",
    ),
    (
        "area/billing",
        "Payment form loses the card when the page is idle",
        "If the payment page is idle for a while, the card field is empty on submit. The Stripe element times out after 15 min; it has nothing to do with our login.",
    ),
    (
        "area/ui",
        "Language switcher resets after logging out",
        "The chosen language is stored in the user profile only; after logging out the login page is in English again.",
    ),
    (
        "area/ci",
        "Integration tests leak auth test fixtures into the search index",
        "The search integration tests index the auth fixtures (users, tokens) and later assertions count them. The search tests should use their own namespace.",
    ),
    (
        "area/search",
        "Typeahead requests are not cancelled after navigation",
        "Right after login, if you type in search and navigate away, the typeahead requests keep running and hammer the API.",
    ),
    (
        "area/ui",
        "Timezone banner shows on every login for users in Asia/Kolkata",
        "The half-hour offset breaks the comparison in the timezone banner.",
    ),
    (
        "area/billing",
        "Seat count includes deactivated users",
        "Deactivated users (who can no longer log in) are still counted as seats on the invoice.",
    ),
    (
        "area/ui",
        "Print view of a record cuts off the last column",
        "Print view is broken on A4. (I noticed after logging in from a fresh browser profile, but it happens regardless.)",
    ),
    (
        "area/search",
        "Search API returns 500 for queries with emoji",
        "Searching for 🚀 returns 500. The request is authenticated fine; the failure is in the highlighter slicing strings by byte.",
    ),
];

/// Issues about the OLD auth path: `auth/v1`, legacy LDAP login. Several share
/// symptoms with new-path causes on purpose.
pub(super) const LEGACY_AUTH: &[(&str, &str)] = &[
    (
        "LDAP bind fails for DNs containing umlauts (auth/v1)",
        "The legacy LDAP login fails for users like `cn=Jürgen Müller,ou=Zürich,dc=acme,dc=io`: auth/v1 escapes the DN as Latin-1 before binding.",
    ),
    (
        "Legacy login: session timeout ignores `session_ttl`",
        "In auth/v1 the session always expires after 8 h regardless of `session_ttl`. The legacy session middleware reads the wrong config key.",
    ),
    (
        "auth/v1 LDAP connection pool leaks on timeout",
        "When the LDAP server times out, auth/v1 never returns the connection to the pool; after ~50 timeouts nobody can log in until restart.",
    ),
    (
        "Old login page redirect loop when the LDAP server is unreachable",
        "With `new_auth_path` disabled, the legacy login page redirects to itself when the LDAP server is down, instead of showing an error.",
    ),
    (
        "auth/v1: password change does not invalidate other sessions",
        "Changing the password in the legacy account page leaves other sessions alive.",
    ),
    (
        "Legacy LDAP login slow with nested groups",
        "auth/v1 resolves nested groups one query at a time; users in 40 groups wait 9 s to log in.",
    ),
    (
        "auth/v1 cookie scoped to www.acme.io on self-hosted",
        "On self-hosted installs with the legacy login, the cookie domain comes from the old `BASE_URL` setting, so it ends up as www.acme.io.",
    ),
    (
        "auth/v1 refresh endpoint returns 500 under load",
        "The legacy `/auth/v1/refresh` endpoint takes a global mutex; under load it times out and returns 500.",
    ),
    (
        "Legacy login: \"remember me\" checkbox does nothing",
        "In auth/v1 the remember-me flag is parsed but never used.",
    ),
    (
        "LDAP group sync drops users with a comma in their CN",
        "The legacy LDAP sync splits DNs on commas without handling escapes, e.g. `cn=Smith\\, John`.",
    ),
    (
        "auth/v1 accepts expired LDAP passwords",
        "If the LDAP password is expired, the legacy login still succeeds because auth/v1 ignores the `passwordExpired` control.",
    ),
    (
        "Legacy login lockout counter never resets",
        "The failed-attempt counter in auth/v1 is only reset on success; users who stop trying stay locked.",
    ),
    (
        "auth/v1: LDAPS certificate validation disabled by default",
        "The legacy LDAP client sets `verify=false` when `LDAP_CA_FILE` is empty.",
    ),
    (
        "Legacy login page not translated (de, ja)",
        "The old login page only ships English strings; Anmelden / ログイン are missing.",
    ),
    (
        "auth/v1 JWT signing key rotation requires a restart",
        "The legacy path loads the signing key once at boot.",
    ),
    (
        "Legacy LDAP login fails with Active Directory referrals",
        "auth/v1 does not chase referrals, so users in the child domain cannot log in.",
    ),
    (
        "auth/v1: clock drift breaks legacy API keys",
        "Legacy HMAC API keys use a 5 s window and drifting workers reject them.",
    ),
    (
        "Old auth path logs LDAP bind passwords at DEBUG",
        "auth/v1 logs the bind request including the password when `LOG_LEVEL=debug`.",
    ),
    (
        "Legacy SAML bridge drops the RelayState",
        "The auth/v1 SAML bridge ignores RelayState, so deep links land on the home page.",
    ),
    (
        "auth/v1 session table grows without bound",
        "Expired legacy sessions are never purged; the table has 40 M rows on the largest install.",
    ),
    (
        "Legacy login: MFA prompt shown twice",
        "With TOTP enabled, auth/v1 asks for the code twice when the LDAP bind is slow.",
    ),
    (
        "auth/v1 returns 200 with an error page on LDAP failure",
        "Monitoring cannot see legacy login failures because the error page is served with status 200.",
    ),
];

pub(super) const LEGACY_CONTEXT: &[&str] = &[
    "This is the legacy path (`auth/v1`, `new_auth_path` disabled), unrelated to the new login work.",
    "We are still on the old LDAP login; the new authentication path is not enabled for this tenant.",
    "Has been broken since 2.7 in the old auth code (`auth/v1/ldap.rs`); nothing to do with auth/v2.",
    "Reproduced with `new_auth_path=false`. With the flag on the problem goes away, since auth/v2 does not use this code.",
    "Legacy on-prem customers still rely on auth/v1, so it needs fixing even after 3.0.",
];

pub(super) const LEGACY_BLOCKER_NOTES: &[&str] = &[
    "This blocks 3.0 for on-prem customers who stay on LDAP.",
    "Release blocker: 3.0 must keep the legacy login working for on-prem.",
    "We promised LDAP customers that 3.0 does not regress the old login, so this is a blocker.",
];

pub(super) const NEAR_DUP_INTROS: &[&str] = &[
    "Possibly duplicate of #{n}, but filing separately because the symptoms look different for us.",
    "Might be a duplicate of #{n}? Our setup is a bit different so I'm not sure.",
    "Possibly duplicate of #{n}. Same tenant type, reported independently by a second customer.",
    "Could be the same as #{n}; leaving it open until someone confirms.",
];

pub(super) const CLOSED_NOTES: &[&str] = &[
    "**Update:** {fix}",
    "Closing. {fix}",
    "{fix} Closing as completed.",
];

/// Filler areas: ordinary bugs and requests that never touch authentication.
#[derive(Clone, Default)]
pub(super) struct Area {
    pub name: &'static str,
    pub label: Option<&'static str>,
    pub bug_titles: &'static [&'static str],
    pub feature_titles: &'static [&'static str],
    pub details: &'static [&'static str],
    pub logs: &'static [&'static str],
}

pub(super) const AREAS: &[Area] = &[
    Area {
        name: "billing",
        label: Some("area/billing"),
        bug_titles: &[
            "Invoice PDF cuts off long company names",
            "Coupon codes are case sensitive",
            "Plan downgrade does not refund the unused seats",
            "VAT number validation rejects valid Irish numbers",
            "Billing history pagination skips a page",
            "Currency rounding differs between invoice and receipt",
            "Trial end date shown in the wrong format",
            "Payment method update fails for cards expiring this month",
            "Invoice emails contain a broken link to the billing portal",
            "Usage chart on the billing page double-counts weekends",
            "Seat limit warning appears one seat too early",
            "Credit balance not applied to the first invoice",
        ],
        feature_titles: &[
            "Allow PO numbers on invoices",
            "Support SEPA direct debit",
            "Send a usage summary email before renewal",
            "Export invoices as CSV",
            "Show the next invoice estimate on the billing page",
        ],
        details: &[
            "Finance noticed this while reconciling last month's invoices.",
            "The amounts in the database are correct; only the rendering is off.",
            "Stripe shows the right value, our copy of it is wrong.",
            "Affects roughly 3 % of workspaces according to the billing dashboard.",
            "The customer asked for a corrected invoice.",
        ],
        logs: &[
            "INFO billing::invoice: rendering invoice INV-2291 for workspace ws_8812",
            "WARN billing::tax: falling back to default tax rate for country=IE",
            "ERROR billing::stripe: webhook invoice.paid handler returned 500",
            "DEBUG billing::proration: days_remaining=17 period_days=31",
        ],
    },
    Area {
        name: "search",
        label: Some("area/search"),
        bug_titles: &[
            "Phrase queries ignore stop words",
            "Search results page jumps to the top on every keystroke",
            "Sorting by relevance is unstable between pages",
            "Facet counts off by one after deleting a record",
            "Wildcard query on numeric fields returns nothing",
            "Search highlights the wrong word in long descriptions",
            "Autocomplete suggests archived projects",
            "Query with a trailing backslash returns 500",
            "Index lag of several minutes after bulk import",
            "Fuzzy search too aggressive for short words",
            "Date range filter excludes the end date",
            "Search box loses focus after pressing Enter",
        ],
        feature_titles: &[
            "Support boolean operators in the search box",
            "Save recent searches per user",
            "Search inside attachments",
            "Add a \"did you mean\" suggestion",
            "Boost exact title matches",
        ],
        details: &[
            "The same query worked in 2.8.",
            "Happens on about one in five queries.",
            "Reproducible on the demo workspace.",
            "The index looks healthy according to `/admin/search/status`.",
            "Only visible with more than 10k records.",
        ],
        logs: &[
            "INFO search::query: parsed query in 2ms terms=3",
            "WARN search::index: segment merge took 4312ms",
            "ERROR search::query: failed to parse range: unexpected end of input",
            "DEBUG search::rank: bm25 k1=1.2 b=0.75",
        ],
    },
    Area {
        name: "ui",
        label: Some("area/ui"),
        bug_titles: &[
            "Sidebar collapses when resizing the window",
            "Tooltip text truncated in the record table",
            "Dark mode: chart axis labels unreadable",
            "Modal cannot be closed with Escape",
            "Drag and drop reorders the wrong column",
            "Breadcrumbs show an internal id instead of the name",
            "Empty state illustration overlaps the create button",
            "Scroll position lost when returning to the list",
            "Column widths reset after refresh",
            "Inline edit saves on blur even when cancelled",
            "Toast notifications stack off-screen",
            "Context menu opens at the wrong position on wide screens",
        ],
        feature_titles: &[
            "Keyboard shortcut to create a record",
            "Compact density option for tables",
            "Pin favourite dashboards to the sidebar",
            "Remember collapsed sidebar state",
            "High contrast theme",
        ],
        details: &[
            "Tested on Chrome 124 and Firefox 126, same result.",
            "Screenshot attached.",
            "This started after the design system upgrade.",
            "Only happens at 125 % browser zoom.",
            "Several users mentioned it in the feedback widget.",
        ],
        logs: &[
            "WARN ui::table: column width NaN for column \"owner\"",
            "ERROR ui::console: TypeError: Cannot read properties of null (reading 'focus')",
            "DEBUG ui::layout: sidebar collapsed=true width=64",
        ],
    },
    Area {
        name: "ci",
        label: Some("area/ci"),
        bug_titles: &[
            "Lint job takes 14 minutes",
            "Cache key ignores Cargo.lock changes",
            "Windows job fails on path length",
            "Coverage upload flaky",
            "Dependabot PRs do not run the e2e suite",
            "Release notes generator drops merged PRs with emoji titles",
            "Docker layer cache never hits on the arm runners",
            "Benchmarks job not pinned to a dedicated runner",
            "Test reports not uploaded when the job is cancelled",
            "Pre-commit hook differs from the CI formatter",
        ],
        feature_titles: &[
            "Run the e2e suite on merge queue only",
            "Nightly build with sanitizers",
            "Publish preview environments for every PR",
            "Post bundle size diff as a PR comment",
        ],
        details: &[
            "See the last three runs on main.",
            "Started after the runner image update.",
            "Retrying usually makes it pass, which is the worst kind of flaky.",
            "It wastes about 20 minutes per PR.",
        ],
        logs: &[
            "INFO ci::runner: job lint started on runner ubuntu-22.04-4core",
            "WARN ci::cache: cache miss for key deps-linux-8f3a2c",
            "ERROR ci::step: process completed with exit code 137",
            "INFO ci::upload: uploaded 212 test reports",
        ],
    },
    Area {
        name: "api",
        label: None,
        bug_titles: &[
            "GET /api/v3/records ignores the `limit` parameter above 500",
            "PATCH on a record resets fields not present in the body",
            "API returns 500 instead of 422 for invalid JSON",
            "Rate limit headers missing on 429 responses",
            "OpenAPI spec lists the wrong type for `created_at`",
            "Webhook deliveries retried without backoff",
            "Cursor pagination returns duplicates when records are inserted",
            "Bulk endpoint accepts more than the documented 1000 items",
            "API returns timestamps without the time zone offset",
            "ETag changes even when the record did not change",
        ],
        feature_titles: &[
            "Add `updated_since` filter to the records endpoint",
            "GraphQL endpoint for dashboards",
            "Webhook signature with timestamp to prevent replay",
            "Batch delete endpoint",
        ],
        details: &[
            "Our integration broke because of this.",
            "The OpenAPI document says otherwise.",
            "Reproducible with curl, see below.",
            "A partner (Initech) reported it through their account manager.",
        ],
        logs: &[
            "INFO api::records: GET /api/v3/records 200 412ms",
            "WARN api::ratelimit: workspace ws_1191 at 95% of quota",
            "ERROR api::records: PATCH /api/v3/records/rec_77 500: null value in column \"owner_id\"",
        ],
    },
    Area {
        name: "export",
        label: None,
        bug_titles: &[
            "CSV export escapes quotes incorrectly",
            "Excel export loses leading zeros in ZIP codes",
            "Export of more than 100k rows times out",
            "PDF export renders charts at low resolution",
            "Scheduled exports sent at the wrong hour after DST",
            "Export filename contains a colon on Windows",
            "JSON export omits custom fields",
            "Export progress bar stuck at 99 %",
        ],
        feature_titles: &[
            "Parquet export",
            "Export to Google Sheets",
            "Choose columns before exporting",
        ],
        details: &[
            "The file opens but the data is shifted.",
            "Customer needs this for their monthly report.",
            "Worked fine before the export service was split out.",
        ],
        logs: &[
            "INFO export::job: job exp_5521 started rows=104233",
            "WARN export::csv: field contains embedded newline, quoting",
            "ERROR export::job: job exp_5521 exceeded 300s deadline",
        ],
    },
    Area {
        name: "notifications",
        label: None,
        bug_titles: &[
            "Digest email sent twice on Mondays",
            "Slack notifications use the wrong channel after rename",
            "Mention notifications not sent for comments on archived records",
            "Unsubscribe link in digest emails 404s",
            "Push notifications arrive without a title on Android",
            "Email notifications ignore the quiet hours setting",
            "Notification settings page does not save the weekly digest toggle",
        ],
        feature_titles: &[
            "Microsoft Teams integration",
            "Per-project notification settings",
            "Snooze notifications",
        ],
        details: &[
            "Users have started filtering our emails as spam.",
            "Happens only for workspaces created before 2024.",
            "The job scheduler logs show two runs.",
        ],
        logs: &[
            "INFO notify::digest: sending digest to 4412 recipients",
            "WARN notify::slack: channel C02ABC not found, falling back to default",
            "ERROR notify::push: FCM returned 400 InvalidParameters",
        ],
    },
    Area {
        name: "mobile",
        label: Some("area/ui"),
        bug_titles: &[
            "iOS app crashes when rotating on the record view",
            "Android app shows the wrong app icon badge",
            "Offline edits lost when the app is killed",
            "Pull to refresh does not refresh attachments",
            "Camera upload fails for HEIC images",
            "Tablet layout wastes half the screen",
            "App ignores the system font size",
        ],
        feature_titles: &[
            "Widgets for the iOS home screen",
            "Offline mode for dashboards",
            "Share extension for Android",
        ],
        details: &[
            "Crash report attached from TestFlight.",
            "Happens on iOS 17.4, not on 17.2.",
            "Android 14, Pixel 7.",
        ],
        logs: &[
            "ERROR mobile::ios: *** Terminating app due to uncaught exception 'NSRangeException'",
            "WARN mobile::sync: 3 pending edits discarded on cold start",
        ],
    },
    Area {
        name: "performance",
        label: None,
        bug_titles: &[
            "Record list takes 6 s to render for 2k rows",
            "Memory grows unbounded in the worker process",
            "Slow query on the activity feed for big workspaces",
            "Dashboard makes 40 sequential requests on load",
            "Bundle size grew by 900 KB in 2.9",
            "Background jobs starve the API pool during imports",
            "N+1 queries on the project overview page",
        ],
        feature_titles: &[
            "Add query timing to the debug panel",
            "Cache dashboard widget results for 60 s",
        ],
        details: &[
            "Flame graph attached.",
            "p95 went from 300 ms to 2.1 s after the release.",
            "The slow query log shows the same statement hundreds of times.",
        ],
        logs: &[
            "WARN db::slowlog: 2314ms SELECT * FROM activity WHERE workspace_id = $1 ORDER BY created_at DESC",
            "INFO worker::mem: rss=3.1GiB heap=2.7GiB",
            "WARN api::pool: waited 840ms for a connection",
        ],
    },
    Area {
        name: "i18n",
        label: Some("area/ui"),
        bug_titles: &[
            "German translation overflows buttons",
            "Japanese dates shown in US format",
            "Pluralisation wrong in Polish",
            "French number formatting uses a comma as thousands separator",
            "Right-to-left layout broken in the editor",
            "Missing translations in the settings page",
        ],
        feature_titles: &[
            "Add Brazilian Portuguese",
            "Let users pick a date format independent of the language",
        ],
        details: &[
            "Reported by our team in Zürich.",
            "See screenshot: \"Änderungen übernehmen\" is cut off.",
            "Locale: ja-JP.",
        ],
        logs: &["WARN i18n::catalog: missing key settings.danger_zone.title for locale de"],
    },
    Area {
        name: "docs",
        label: None,
        bug_titles: &[
            "Broken link in the webhooks guide",
            "API reference example uses the deprecated v2 endpoint",
            "Self-hosting guide lists the wrong Postgres version",
            "Typo in the quick start",
            "Code samples in the SDK docs do not compile",
            "Search in the docs site returns nothing for \"webhook\"",
        ],
        feature_titles: &[
            "Add a troubleshooting page for imports",
            "Document rate limits per plan",
            "Versioned docs for 2.x and 3.x",
        ],
        details: &[
            "Spotted while onboarding a new teammate.",
            "The example returns 404 when copied verbatim.",
        ],
        logs: &[],
    },
    Area {
        name: "infra",
        label: Some("area/ci"),
        bug_titles: &[
            "Helm chart ignores `resources.limits` for the worker",
            "Backups not encrypted on self-hosted S3-compatible storage",
            "Postgres migrations lock the records table for minutes",
            "Health check fails when Redis is slow to start",
            "Terraform module hard-codes the us-east-1 region",
            "Log rotation missing in the Docker image",
        ],
        feature_titles: &[
            "Official ARM64 images",
            "Prometheus metrics for the worker queue",
            "Zero-downtime migrations",
        ],
        details: &[
            "Self-hosted customer on Kubernetes 1.29.",
            "Our SRE team flagged it in the last incident review.",
        ],
        logs: &[
            "ERROR db::migrate: lock timeout on table records after 120s",
            "WARN k8s::probe: readiness probe failed: connection refused",
        ],
    },
];

pub(super) const TITLE_QUALIFIERS: &[&str] = &[
    " (regression)",
    " intermittently",
    " for large workspaces",
    " on self-hosted",
    " since 2.8.3",
    " after upgrading to 2.9",
    " in the EU region",
    " on staging only",
    " again",
    " for some customers",
];

pub(super) const OPENERS: &[&str] = &[
    "Hi team,",
    "Reported by a customer via support.",
    "Found this while testing the release candidate.",
    "Not sure if this is known already.",
    "Hey! 👋",
    "Follow-up from yesterday's standup.",
    "Seen in production this morning.",
    "Our QA found this during the regression pass.",
];

pub(super) const EXPECTED: &[&str] = &[
    "It should just work like it did before.",
    "No error, and the page shows the data.",
    "The operation succeeds.",
    "Same behaviour as in 2.9.",
];

pub(super) const FEATURE_MOTIVATIONS: &[&str] = &[
    "Several customers asked for this in the last quarter.",
    "This would save our team a lot of manual work.",
    "Competitors have had this for a while.",
    "Happy to contribute a PR if the approach sounds good.",
    "Low priority, but it comes up in every demo.",
];

/// Non-ASCII fragments: real trackers are multilingual and tools must not
/// assume ASCII. None of these mention authentication.
pub(super) const NON_ASCII: &[&str] = &[
    "Gemeldet von unserem Team in Zürich: nach dem Klick auf „Speichern“ passiert manchmal gar nichts.",
    "検索結果が表示されない場合があります。再現手順は上記の通りです。",
    "The naïve fix would be to retry, but that just hides it 🙃",
    "Merci à l'équipe de Montréal pour le rapport, ça bloque leur démo de vendredi.",
    "Straße gets upper-cased to STRASSE in the export, which the customer in München noticed.",
    "🔥🔥 this is hitting a lot of people",
    "お手数ですが、確認をお願いします。🙏",
    "Kunde aus Köln, Ticket #4471 — bitte priorisieren.",
    "Café names like \"Crème Brûlée Co.\" look fine in the UI, just mentioning it for completeness.",
];

pub(super) const BROWSERS: &[&str] = &[
    "Chrome 124",
    "Firefox 126",
    "Safari 17.4",
    "Edge 124",
    "Chrome 125 (Android)",
    "Safari (iOS 17.5)",
];

pub(super) const DEPLOYMENTS: &[&str] = &[
    "SaaS (us-east-1)",
    "SaaS (eu-west-1)",
    "self-hosted, Helm chart 4.2.1",
    "self-hosted, docker compose",
    "on-prem (air-gapped)",
];

pub(super) const IDPS: &[&str] = &[
    "Okta",
    "Azure AD (Entra ID)",
    "Keycloak 24",
    "Google Workspace",
    "OneLogin",
];

/// `(login, display name)`; an empty name is how gh reports users who never
/// set one.
pub(super) const PEOPLE: &[(&str, &str)] = &[
    ("mkowalski", "Marta Kowalski"),
    ("jdoe-acme", "Jane Doe"),
    ("tnguyen", "Thanh Nguyen"),
    ("rpatel", "Ravi Patel"),
    ("sofia-lindqvist", "Sofia Lindqvist"),
    ("jmueller", "Jürgen Müller"),
    ("akiko-t", "田中 明子"),
    ("obrien-dev", "Siobhán O'Brien"),
    ("carlos-r", "Carlos Ruiz"),
    ("zoe-h", "Zoë Hartmann"),
    ("ben-k", "Ben Kim"),
    ("lucas-m", "Lucas Martin"),
    ("priya-s", "Priya Sharma"),
    ("omar-f", "Omar Farouk"),
    ("elena-v", "Elena Volkova"),
    ("dhall", ""),
    ("kwame-a", "Kwame Asante"),
    ("ingrid-b", "Ingrid Berg"),
    ("tomasz-w", "Tomasz Wiśniewski"),
    ("hana-y", "山本 花"),
    ("support-anna", "Anna (Support)"),
    ("support-li", "Li Wei"),
    ("qa-rob", "Rob Stevens"),
    ("pm-claire", "Claire Dubois"),
    ("sre-max", "Max Becker"),
    ("femi-o", "Femi Okafor"),
    ("nora-j", "Nora Jensen"),
    ("yusuf-k", "Yusuf Kaya"),
    ("isabella-c", "Isabella Costa"),
    ("ahmed-h", ""),
    ("grace-l", "Grace Liu"),
    ("victor-p", "Victor Petrov"),
    ("mia-s", "Mia Schulz"),
    ("noah-w", "Noah Williams"),
    ("chloe-b", "Chloé Bernard"),
    ("raj-n", "Raj Nair"),
    ("eva-n", "Eva Novák"),
    ("sam-t", "Sam Taylor"),
    ("lea-g", "Léa Girard"),
    ("diego-a", "Diego Alvarez"),
];

pub(super) const BOTS: &[&str] = &["app/dependabot", "app/acme-triage-bot"];

/// Titles for bot-filed issues, which gh reports with `is_bot: true`.
pub(super) const BOT_TITLES: &[&str] = &[
    "Dependency dashboard",
    "Weekly flaky test report",
    "Stale docs pages report",
    "Bump serde_json from 1.0.120 to 1.0.128",
    "Bump vite from 5.2.0 to 5.4.2",
    "Nightly benchmark regression detected",
];

/// Words that must not appear in filler, so filler can never accidentally
/// become an auth issue.
#[cfg(test)]
pub(super) const AUTH_WORDS: &[&str] = &[
    "auth",
    "login",
    "log in",
    "logged",
    "sign in",
    "sign-in",
    "signed",
    "token",
    "session",
    "sso",
    "oidc",
    "cookie",
    "password",
    "ldap",
    "credential",
    "idp",
];
