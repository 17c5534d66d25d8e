//! Property tests of billing with the shipped catalog: a call's cost is never negative and
//! never below the provider's price, adds up exactly over calls, equals the hand computation
//! from the catalog file's own decimal strings, and the worst-case reservation is never below
//! the real cost of the call it guards (including across the long-prompt band), with the
//! prompt bounded as the engine bounds it (the last call's usage plus the bytes added since).

use nodus_core::Usd;
use std::sync::LazyLock;

use nodus_core::catalog::{Catalog, Family};
use nodus_core::cost::{self, CostGuard, Usage};
use nodus_core::model::{
    ChatMessage, ContentBlock, Credentials, ModelClient, ModelRequest, Role, ToolChoice,
};
use nodus_llm::catalog::DEFAULT_CATALOG_JSON;
use nodus_llm::{Reply, ScriptedModel, default_catalog};
use proptest::prelude::*;

static CATALOG: LazyLock<Catalog> = LazyLock::new(|| default_catalog().expect("catalog"));
static FILE: LazyLock<serde_json::Value> =
    LazyLock::new(|| serde_json::from_str(DEFAULT_CATALOG_JSON).expect("json"));

/// A decimal string of dollars as nano-dollars, parsed here independently of `Usd`.
fn nanos(text: &str) -> u128 {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut digits = fraction.to_string();
    while digits.len() < 9 {
        digits.push('0');
    }
    whole.parse::<u128>().expect("whole") * 1_000_000_000
        + digits.parse::<u128>().expect("fraction")
}

/// The four rates of a model, read from the catalog file's JSON text: the band's when the
/// prompt is past its threshold.
fn rates_from_file(model: &str, prompt_tokens: u64) -> [u128; 4] {
    let file = &*FILE;
    let entry = file["families"]
        .as_object()
        .expect("families")
        .values()
        .chain(file["models"].as_array().expect("models"))
        .find(|entry| entry["model"] == model)
        .expect("priced")
        .clone();
    let mut prices = entry["prices"].clone();
    if let Some(band) = prices.get("longPrompt")
        && prompt_tokens > band["abovePromptTokens"].as_u64().expect("threshold")
    {
        prices = band["rates"].clone();
    }
    ["input", "output", "cacheWrite", "cacheRead"]
        .map(|name| nanos(prices[name].as_str().expect(name)))
}

/// By hand: Σ tokens × rate per million, divided by 0.875, rounded up to the nano-dollar.
fn by_hand(model: &str, usage: &Usage) -> u128 {
    let [i, o, w, r] = rates_from_file(model, usage.prompt_tokens());
    let provider = u128::from(usage.input_tokens) * i
        + u128::from(usage.output_tokens) * o
        + u128::from(usage.cache_write_tokens) * w
        + u128::from(usage.cache_read_tokens) * r;
    (provider * 1000).div_ceil(875 * 1_000_000)
}

fn models() -> Vec<String> {
    let catalog = &*CATALOG;
    catalog
        .families
        .values()
        .chain(catalog.models.iter())
        .map(|entry| entry.model.clone())
        .collect()
}

fn usage() -> impl Strategy<Value = Usage> {
    (0u64..400_000, 0u64..64_000, 0u64..150_000, 0u64..300_000).prop_map(
        |(input_tokens, output_tokens, cache_write_tokens, cache_read_tokens)| Usage {
            input_tokens,
            output_tokens,
            cache_write_tokens,
            cache_read_tokens,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_call_costs_the_hand_computation_never_less_than_the_provider_price(
        pick in any::<prop::sample::Index>(),
        usage in usage(),
    ) {
        let catalog = &*CATALOG;
        let models = models();
        let model = pick.get(&models);
        let prices = catalog.prices_of(model).expect("priced");
        let billed = cost::bill(prices, &usage);
        prop_assert_eq!(u128::from(billed.nanos()), by_hand(model, &usage));
        // Never below the provider's own price (the margin is added, never subtracted), and
        // zero only when nothing was used.
        let [i, o, w, r] = rates_from_file(model, usage.prompt_tokens());
        let provider = u128::from(usage.input_tokens) * i + u128::from(usage.output_tokens) * o
            + u128::from(usage.cache_write_tokens) * w + u128::from(usage.cache_read_tokens) * r;
        prop_assert!(u128::from(billed.nanos()) * 1_000_000 >= provider);
        prop_assert_eq!(billed.is_zero(), usage == Usage::default());
    }

    #[test]
    fn costs_add_up_exactly_over_the_calls_of_a_run(
        family in prop::sample::select(Family::ALL.to_vec()),
        calls in prop::collection::vec(usage(), 1..40),
    ) {
        let catalog = &*CATALOG;
        let entry = catalog.family(family).expect("family");
        let mut guard = CostGuard::new(None, Usd::ZERO);
        let mut by_hand_total = 0u128;
        let mut summed = Usd::ZERO;
        for usage in &calls {
            let billed = cost::bill(&entry.prices, usage);
            let reservation = guard.reserve(billed).expect("uncapped");
            prop_assert!(guard.settle(reservation, billed));
            by_hand_total += by_hand(&entry.model, usage);
            summed = summed.checked_add(billed).expect("no overflow at these sizes");
        }
        prop_assert_eq!(u128::from(guard.spent().nanos()), by_hand_total);
        prop_assert_eq!(guard.spent(), summed);
        prop_assert_eq!(calls.iter().map(|u| cost::bill(&entry.prices, u)).sum::<Usd>(), summed);
    }

    #[test]
    fn the_reservation_is_never_below_the_cost_of_the_call_it_guards(
        pick in any::<prop::sample::Index>(),
        usage in usage(),
        extra_prompt in 0u64..50_000,
        extra_output in 0u32..8_000,
    ) {
        let catalog = &*CATALOG;
        let models = models();
        let model = pick.get(&models);
        let prices = catalog.prices_of(model).expect("priced");
        // The guard reserves with an upper bound of the prompt and maxTokens of output; the
        // call then uses at most that.
        let bound = usage.prompt_tokens() + extra_prompt;
        let max_tokens = u32::try_from(usage.output_tokens).expect("small") + extra_output;
        let reserved = cost::worst_case(prices, bound, max_tokens);
        prop_assert!(cost::bill(prices, &usage) <= reserved, "{model} {usage:?} bound {bound}");
        let mut guard = CostGuard::new(Some(reserved), Usd::ZERO);
        let reservation = guard.reserve(reserved).expect("fits exactly");
        prop_assert!(guard.settle(reservation, cost::bill(prices, &usage)));
        prop_assert!(guard.spent() <= reserved);
    }

    #[test]
    fn the_last_usage_plus_the_bytes_added_bound_the_next_prompt(
        texts in prop::collection::vec("[ -~é✓]{0,400}", 1..8),
        added in "[ -~é✓]{0,2000}",
    ) {
        // The scripted model counts a token per 4 bytes (never more tokens than bytes, as the
        // providers' tokenizers); the engine bounds the next prompt by the last call's prompt
        // and output plus the bytes added since.
        let model = ScriptedModel::new(vec![Reply::Text("a reply".into()); 20]);
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut messages: Vec<ChatMessage> = Vec::new();
        for text in &texts {
            messages.push(ChatMessage { role: Role::User, content: vec![ContentBlock::Text { text: text.clone() }] });
            messages.push(ChatMessage { role: Role::Assistant, content: vec![ContentBlock::Text { text: "ok".into() }] });
        }
        let request = |messages: Vec<ChatMessage>| ModelRequest {
            model: "claude-haiku-4-5".into(),
            system: "s".into(),
            messages: messages.into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 512,
            credentials: Credentials::Platform,
        };
        let last = runtime.block_on(model.complete(&request(messages.clone()))).expect("reply");
        let added_message = ChatMessage { role: Role::User, content: vec![ContentBlock::Text { text: added.clone() }] };
        let added_bytes = serde_json::to_string(&added_message.content).expect("json").len() as u64;
        messages.push(added_message);
        let next = runtime.block_on(model.complete(&request(messages))).expect("reply");
        let bound = last.usage.prompt_tokens() + last.usage.output_tokens + added_bytes;
        prop_assert!(next.usage.prompt_tokens() <= bound);
        let catalog = &*CATALOG;
        let prices = catalog.prices_of("claude-haiku-4-5").expect("priced");
        prop_assert!(cost::bill(prices, &next.usage) <= cost::worst_case(prices, bound, 512));
    }
}

#[test]
fn unlisted_models_have_no_price_and_platform_access_refuses_them() {
    let catalog = &*CATALOG;
    assert!(catalog.prices_of("claude-sonnet-5-5").is_none());
    let err =
        nodus_llm::catalog::platform_prices(catalog, "claude-sonnet-5-5").expect_err("unpriced");
    assert_eq!(err.kind, nodus_core::model::ErrorKind::Final);
}
