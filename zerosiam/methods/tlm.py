"""TLM (Hu et al., ICML 2025): test-time learning for language models by input-perplexity minimisation.

Instead of the entropy of its answers, the model lowers the perplexity of the prompt it is given, so it
learns the new domain's language before answering; only prompts with log-perplexity above ln P0 count,
weighted λ·exp(nll − ln P0). A language-model method: its samples are the prompt's positions.
"""

from zerosiam.methods.recipe import Recipe
from zerosiam.parts.perplexity import (
    TLM_LAMBDA,
    TLM_LOG_PERPLEXITY,
    PerplexityAbove,
    PerplexityWeight,
    PromptNLL,
)


def tlm_with(log_p0: float = TLM_LOG_PERPLEXITY, lam: float = TLM_LAMBDA) -> Recipe:
    """TLM with its perplexity threshold ln P0 and weight λ (defaults: TLM's P0 = e³, λ = 0.1)."""
    return Recipe(
        name="tlm",
        objective=PromptNLL(),
        select=[PerplexityAbove(log_p0)],
        weight=PerplexityWeight(log_p0, lam),
    )


tlm = tlm_with()
