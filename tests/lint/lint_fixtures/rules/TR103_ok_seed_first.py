"""Near miss for TR103: set_seed before the model is built; and a model_init callback built after Trainer seeds."""

from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments, set_seed


def make_model():
    return AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)  # ok: via model_init


def main():
    args = TrainingArguments(output_dir="out", seed=42)
    set_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)  # ok
    Trainer(model=model, args=args).train()


def search():
    args = TrainingArguments(output_dir="out", seed=42)
    Trainer(model_init=make_model, args=args).hyperparameter_search(n_trials=4)


if __name__ == "__main__":
    main()
    search()
