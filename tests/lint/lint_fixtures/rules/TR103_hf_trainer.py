"""TR103: the Hugging Face pattern: the model (with a new, randomly initialised head) is built before
Trainer seeds in its constructor."""

from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments


def main():
    args = TrainingArguments(output_dir="out", seed=42)
    tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")  # ok: a tokenizer draws nothing
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)  # expect: TR103
    trainer = Trainer(model=model, args=args, tokenizer=tokenizer)
    trainer.train()


if __name__ == "__main__":
    main()
